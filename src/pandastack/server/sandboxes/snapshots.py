"""Snapshots and fork at the API level: the runtime does the work, the store records who owns
what. A snapshot belongs to the team of the sandbox it was taken from; fork children are new
sandboxes of the parent's team with the parent's lifecycle, environment and metadata."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from pandastack.hostport.errors import HostError, SandboxNotFound, SnapshotNotFound
from pandastack.hostport.results import parent_pause_of
from pandastack.rules import SNAPSHOT_ID_RE
from pandastack.wire.sandboxes import SnapshotInfo

from ..hosts.cluster import durable_fork
from ..store import Sandbox, Snapshot
from ..store.events import forking
from ..web.errors import not_found
from ..web.telemetry import timed
from .service import SandboxService, log

MIB = 1 << 20


def to_snapshot_info(row: Snapshot) -> SnapshotInfo:
    return SnapshotInfo(id=row.id, name=row.name, source_sandbox=row.source_sandbox,
                        template=row.template, created_at=row.created_at, vcpus=row.vcpus,
                        memory_mb=row.memory_mb, disk_mb=row.disk_mb,
                        size_bytes=row.size_bytes)


def snapshot_row(service: SandboxService, team: str, snapshot_id: str) -> Snapshot:
    """The team's snapshot or 404 (also for another team's: its existence is not told)."""
    row = (service.store.get_snapshot(team, snapshot_id)
           if SNAPSHOT_ID_RE.match(snapshot_id) else None)
    if row is None:
        raise not_found(f"snapshot {snapshot_id!r}")
    return row


async def take_snapshot(service: SandboxService, team: str, sandbox_id: str,
                        name: str | None) -> Snapshot:
    """Snapshot the team's sandbox (woken first if hibernated); it keeps running."""
    row = await service.awake(team, sandbox_id)
    # Its size is known once it is taken: a team with no room left is refused before, and
    # the row is admitted with its size (else the snapshot goes again).
    service.store.check_quota(row.team, service.quotas.snapshot_room(0))
    async with service.transition(row.id):
        result = await service.host_call(service.runtime.snapshot(row.id, name))
    info = result.info
    snap = Snapshot(id=info.id, team=row.team, name=name, source_sandbox=row.id,
                    template=info.template, created_at=info.created_at, vcpus=info.vcpus,
                    memory_mb=info.memory_mb, disk_mb=info.disk_bytes // MIB,
                    size_bytes=info.size_bytes or info.state_bytes, deleted_at=None,
                    volumes=service.volumes.record(row.id))
    try:
        return service.store.add_snapshot(snap, service.quotas.snapshot_room(snap.size_bytes))
    except BaseException:
        with contextlib.suppress(HostError):
            await service.runtime.delete_snapshot(info.id)
        raise


async def delete_snapshot(service: SandboxService, team: str, snapshot_id: str) -> None:
    """Delete the team's snapshot; sandboxes created from it keep running (they hold their
    own links to its layers)."""
    row = snapshot_row(service, team, snapshot_id)
    with contextlib.suppress(SnapshotNotFound):
        await service.runtime.delete_snapshot(row.id)
    service.store.delete_snapshot(row.id)


@dataclass(frozen=True)
class Forked:
    parent: Sandbox
    children: list[Sandbox]
    duration_ms: float
    parent_pause_ms: float | None
    """How long the parent stood still for the fork's snapshot, as its host measured it
    (None where the host does not say)."""


@timed("fork")
async def fork(service: SandboxService, team: str, sandbox_id: str, count: int, *,
               durable: bool = False) -> Forked:
    """`count` live copies of the team's sandbox.
    `durable`: children on another host come from a snapshot in the object store."""
    parent = await service.awake(team, sandbox_id)
    admission = service.quotas.admission([(parent.vcpus, parent.memory_mb)] * count)
    service.store.check_quota(parent.team, admission)  # checked again as the children land
    volume_host = service.volumes.host_of_attached(parent.id)  # its children land there
    started = time.monotonic()
    token = durable_fork.set(durable)
    try:
        async with service.transition(parent.id):
            with service.volumes.pinned(volume_host):
                handles = await service.host_call(service.runtime.fork(parent.id, count))
    finally:
        durable_fork.reset(token)
    now = time.time()
    children: list[Sandbox] = []
    # Each child's copies of the parent's read-write volumes (the host made them) and its
    # share of the read-only ones.
    plans = service.volumes.plan_fork(parent, [handle.id for handle in handles])
    try:
        rows: list[Sandbox] = []
        for handle in handles:
            rows.append(Sandbox(
                id=handle.id, team=parent.team, template=parent.template, state="running",
                created_at=now, expires_at=now + parent.ttl_seconds,
                ttl_seconds=parent.ttl_seconds, persistent=parent.persistent,
                vcpus=parent.vcpus, memory_mb=parent.memory_mb, disk_mb=parent.disk_mb,
                env=dict(parent.env or {}), meta=dict(parent.meta or {}),
                last_activity_at=now, ended_at=None, end_reason=None, snapshot=None,
                cwd=parent.cwd, user=parent.user, host_id=service.host_of(handle.id)))
        with forking(parent.id):  # one sandbox.forked event, in the children's transaction
            children = list(service.volumes.admit(rows, admission, plans, at=now))
    except BaseException:
        log.exception("recording the children of a fork of %s failed", parent.id)
        for row in children:
            service.store.end_sandbox(row.id, "failed", "fork could not be recorded")
        for handle in handles:
            with contextlib.suppress(SandboxNotFound):
                await service.runtime.kill(handle.id)
        await service.volumes.forget_clones(plans)
        raise
    return Forked(parent, children, (time.monotonic() - started) * 1000,
                  parent_pause_of(handles))
