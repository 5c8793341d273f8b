"""Persistent sandboxes survive the death of their VM (ADR 0037): such a sandbox becomes
`stopped` with its disk (and any hibernation) kept, and `restart_row` brings it back under
its id. Also here: the reconcile at start, of sandboxes and of snapshot files and rows."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from pandastack.hostport.errors import HostError, SandboxNotFound, SnapshotNotFound

from ..store import Sandbox
from ..store.usage import HOLD_AWAKE
from ..web.errors import api_error_of, conflict
from .parts import CREATE_DEADLINE_SECONDS

if TYPE_CHECKING:
    from pandastack.hostport.results import SnapshotInfo

    from .parts import ServiceParts

log = logging.getLogger("pandastack.server")

#: What the reconcile at start leaves alone although the host holds no database row for it:
#: a user snapshot younger than this may be one whose row is being written right now.
ORPHAN_SNAPSHOT_GRACE_SECONDS = 600.0

# One restart of a sandbox at a time on this server: two requests finding it stopped must
# not both boot it (or both restore its snapshot under its id).
_restarts: dict[str, asyncio.Lock] = {}


def stop_row(service: ServiceParts, row: Sandbox, reason: str) -> Sandbox:
    """A persistent sandbox whose VM died: `stopped`, its disk (and hibernation, if its
    host holds one) kept for `restart_row` (ADR 0037)."""
    updated = service.store.stop_sandbox(row.id, reason)
    log.warning("sandbox %s stopped: %s", row.id, reason)
    return updated if updated is not None else row


async def restart_row(service: ServiceParts, row: Sandbox) -> Sandbox:
    """A stopped sandbox running again under its id: from the hibernation its host holds
    if there is one (memory and processes back), else from its newest snapshot of
    itself (the state at that snapshot), else by booting its own disk (files kept,
    processes not). The row says which (`restored_from`). On a failure it stays
    stopped, and what it had is kept."""
    lock = _restarts.setdefault(row.id, asyncio.Lock())
    try:
        async with lock:
            # Another request may have started it while this one waited.
            current = service.store.get_sandbox(row.team, row.id)
            if current is None or current.state != "stopped":
                return current if current is not None else row
            return await _restart(service, current)
    finally:
        if not lock.locked() and _restarts.get(row.id) is lock:
            del _restarts[row.id]


async def _restart(service: ServiceParts, row: Sandbox) -> Sandbox:
    # Counted as live from the check on (a racing wake or restart of the team sees it),
    # until it runs or the restart fails.
    with service.store.holding(row, HOLD_AWAKE,
                               service.quotas.admission([(row.vcpus, row.memory_mb)]),
                               ("stopped",)):
        return await _start_again(service, row)


async def _start_again(service: ServiceParts, row: Sandbox) -> Sandbox:
    async with service.transition(row.id):
        try:
            handle = await service.runtime.get(row.id)
            held: str | None = handle.state
        except SandboxNotFound:
            held = None  # its directory is gone (a host that lost its disk)
        except HostError as exc:
            raise (api_error_of(exc) or exc) from None
        if held in ("running", "paused") and handle.is_alive():
            # Its VM runs after all (the host was looked at while it restarted): nothing
            # to start, and nothing to discard.
            updated = service.store.update_sandbox(row.id, state=held, stop_reason=None)
            assert updated is not None
            return updated
        mounted = service.store.sandbox_attachments([row.id]).get(row.id, [])
        snap = None if held == "hibernated" else service.store.newest_snapshot_of(row.id)
        if held != "hibernated" and mounted:
            # A boot or a snapshot's restore would not have them mounted as they were.
            raise conflict(f"sandbox {row.id} is stopped with volumes mounted ("
                           + ", ".join(v.name for _, v in mounted) + ") and no "
                           "hibernation to restore them from; kill it to free them")
        source: str
        if held == "hibernated":
            source = "hibernation"
            await service.host_call(service.runtime.wake(row.id))
        elif snap is not None:
            source = "snapshot"
            policy = None
            if held is not None:
                policy = (await service.placement(row.id)).network
                with suppress(SandboxNotFound):
                    await service.host_call(service.runtime.kill(row.id))
            await service.host_call(service.runtime.create(
                snap.template, vcpus=snap.vcpus, memory_mb=snap.memory_mb,
                sandbox_id=row.id, snapshot=snap.id, network=policy))
        elif held is None:
            raise conflict(f"sandbox {row.id} is stopped, its disk is gone from its host "
                           "and it has no snapshot to restore: kill it")
        else:
            source = "disk"
            await service.host_call(service.runtime.wake(row.id))
        updated = service.store.update_sandbox(
            row.id, state="running", restored_from=source, stop_reason=None,
            last_activity_at=time.time(), host_id=service.host_of(row.id) or row.host_id)
        assert updated is not None
        log.info("sandbox %s started again from its %s", row.id, source)
        return updated


async def reconcile(service: ServiceParts) -> tuple[list[str], list[str]]:
    """After `runtime.start()`: rows whose VM is gone -> stopped if persistent (their
    disks kept, ADR 0037), else failed; VMs (and kept disks) whose row ended -> killed,
    VMs without any row -> left running and reported (`unknown_vms`; killed with
    settings.kill_unknown_vms), but for fork children of a sandbox this database has (its
    fork cut off by a crash before their rows: killed); the rows of adopted sandboxes take
    the runtime's state (running, paused or hibernated); snapshot rows whose files are gone
    -> deleted, and user snapshots on the host without a row (older than a grace) ->
    removed. Rows still `starting` (a create interrupted by a restart) count as gone."""
    listed = {h.id: h for h in await service.runtime.list_sandboxes()}
    service.mark_lost_hosts()
    failed: list[str] = []
    stopped: list[str] = []
    # Another API server of a cluster may be creating it right now: only a create older
    # than any create may take counts as interrupted.
    started_before = time.time() - CREATE_DEADLINE_SECONDS if service.cluster else None
    for row in service.store.live_sandboxes():
        if row.state == "host_lost":
            continue
        if (row.state == "starting" and started_before is not None
                and row.created_at > started_before):
            continue
        held = listed.get(row.id)
        gone = held is None or (held.state != "hibernated" and not held.is_alive())
        if row.state != "starting" and gone and row.persistent and (
                held is not None or service.store.newest_snapshot_of(row.id) is not None):
            if row.state != "stopped":
                service.stop_row(row, "VM gone after a server restart")
            stopped.append(row.id)
        elif row.state == "starting" or gone:
            reason = ("VM gone after a server restart" if held is not None
                      or row.state == "starting" else
                      "its disk is gone from the host (and it has no snapshot)")
            service.store.end_sandbox(row.id, "failed", reason)
            failed.append(row.id)
        elif row.state != "stopped":
            await service.sync_state(row)
    if stopped:
        log.warning("reconciled after start: %d persistent sandboxes stopped (their VMs "
                    "are gone, their disks kept): %s", len(stopped), ", ".join(stopped))
    keep = {row.id for row in service.store.live_sandboxes()}
    killed: list[str] = []
    unknown: list[str] = []
    for sid in sorted(set(listed) - keep):
        # A VM with an ended row lost its kill to a host out of reach: it goes. One without
        # any row is no leftover of this database (restored from an older backup, or another
        # server's sharing the host): the database cannot say whose it is, so it is reported,
        # not silently killed (ADR 0047, addendum). But for a fork child of a sandbox this
        # database has: its fork was cut off between the host's fork and the children's rows
        # (a server killed then; bench/chaos.py's fork blows left them running), so no one
        # was ever told of it, and it goes.
        parent = listed[sid].forked_from
        if (service.store.sandbox_by_id(sid) is None and not service.settings.kill_unknown_vms
                and (parent is None or service.store.sandbox_by_id(parent) is None)):
            unknown.append(sid)
            continue
        with suppress(SandboxNotFound):
            await service.runtime.kill(sid)
        killed.append(sid)
    service.unknown_vms = unknown
    if unknown:
        log.warning("reconciled after start: %d VMs on the host have no row in this database "
                    "and are left running (a database restored from an older backup? "
                    "PANDASTACK_KILL_UNKNOWN_VMS=1 kills them at the next start): %s",
                    len(unknown), ", ".join(unknown))
    if service.cluster is not None:
        # Snapshots live in the object store, not only on the host that took them.
        return failed, killed
    await reconcile_snapshots(service)
    return failed, killed


async def reconcile_snapshots(service: ServiceParts) -> None:
    """Snapshot rows whose files the host lost are deleted (a create from one answers 404, as
    for any deleted snapshot). A user snapshot the host holds without a row is removed when
    it is older than ORPHAN_SNAPSHOT_GRACE_SECONDS (a younger one may have its row written
    right now) and was taken of a sandbox this database knows: a crash between the host's
    snapshot and its row leaves one. Snapshots of sandboxes the database never had are left
    alone: several servers, each with its own database, may share a host's snapshots
    directory (its default is under PANDASTACK_HOME)."""
    held = {info.id: info for info in await service.runtime.list_snapshots()}
    rows = service.store.list_snapshots(None)
    for snap in rows:
        if snap.id not in held:
            log.warning("snapshot %s of team %s is gone from the host", snap.id, snap.team)
            service.store.delete_snapshot(snap.id)
    await _remove_orphans(service, held, {snap.id for snap in rows})


async def remove_orphan_snapshots(service: ServiceParts) -> None:
    """The orphan half of `reconcile_snapshots`, safe while the server runs (the lifecycle
    loop calls it now and then): a snapshot or fork cut short by a crash leaves its files on
    the host, and a server that lives long would otherwise keep them until its next start."""
    held = {info.id: info for info in await service.runtime.list_snapshots()}
    # rows read after the files were listed: a snapshot whose row is written in between is
    # known here (and a younger one is within the grace anyway)
    known = {snap.id for snap in service.store.list_snapshots(None)}
    await _remove_orphans(service, held, known)


async def _remove_orphans(service: ServiceParts, held: dict[str, SnapshotInfo],
                          known: set[str]) -> None:
    before = time.time() - ORPHAN_SNAPSHOT_GRACE_SECONDS
    for sid, info in sorted(held.items()):
        if (sid in known or info.created_at >= before
                or service.store.sandbox_by_id(info.source) is None):
            continue
        log.warning("snapshot %s of sandbox %s has no database row: removed", sid, info.source)
        with suppress(SnapshotNotFound):
            await service.runtime.delete_snapshot(sid)
