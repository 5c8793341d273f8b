"""Snapshots and forks of a host's sandboxes (`HostRuntime.snapshot`, `.fork`): memory, device
state and the disk frozen at one instant while the sandbox goes on, and the live copies made
from such a snapshot. A sandbox with read-write volumes is stopped for the copy of its
volumes, so the copies are the disks its memory refers to (ADR 0027)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.host.runtime.disk_layers import needs_merge
from pandastack.host.runtime.records import SandboxRecord
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.runtime.snapshots import (
    STREAM,
    allocated_bytes,
    link_layers,
    new_layer_name,
    out_of_space,
)
from pandastack.host.vmm.driver import Capability, VMProcess, max_stream_bytes, require
from pandastack.host.volumes.attach import mounts_of
from pandastack.hostport.errors import HostError, SnapshotFailed, SnapshotNotFound
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.results import ForkChildren, SnapshotInfo, SnapshotResult
from pandastack.rules import MAX_FORK
from pandastack.tracing import span, traced

if TYPE_CHECKING:
    from pandastack.host.runtime.parts import RuntimeParts

MIB = 1 << 20


class Saves:
    def __init__(self, rt: RuntimeParts):
        self.rt = rt

    @traced("runtime.snapshot")
    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False, short_pause: bool | None = None,
                       transient: bool = False, resync_clock: bool = True) -> SnapshotResult:
        """Capture memory, device state and disk; the sandbox keeps running (or paused).

        `short_pause` (default: for snapshots users keep) stops the guest as briefly as the
        VMM allows even if the save takes longer; without it the save is as fast as possible
        (what a fork wants: its children wait for the stream). `transient`: the snapshot is
        deleted as soon as the sandboxes made from it run (a fork's), so its stream may go
        into the fork buffer: memory, gone with a restart of the host. Without `resync_clock`
        the caller sets the guest's clock again itself (`resync_parent_clock`)."""
        rt = self.rt
        capabilities = rt.driver.capabilities
        if short_pause is None:
            short_pause = not internal and Capability.SHORT_PAUSE_SAVES in capabilities
        elif short_pause:
            require(rt.driver, Capability.SHORT_PAUSE_SAVES, "a short-pause snapshot")
        in_place = transient and Capability.STREAM_IN_PLACE in capabilities
        handle, vm = rt.table.running(sandbox_id, "running", "paused")
        async with handle.lifecycle_lock:
            await rt.settle_flatten(sandbox_id, vm)
            record = rt.table.record(sandbox_id)
            snap_id = rt.snapshots.new_id()
            needed = record.memory_mb * MIB
            try:
                work = rt.snapshots.begin(snap_id, hold=transient)
            except OSError as exc:
                raise SnapshotFailed(str(exc), disk_switched=False,
                                     no_space=out_of_space(exc, rt.snapshots.root,
                                                           needed)) from exc
            new_top = new_layer_name(rt.driver.disks.suffix)
            switched = False
            # A fork's stream lives only until its children run: into the warm buffer if
            # there is one (the pause is then mostly the copy, ADR 0010).
            buffer = rt.fork_buffer.take(max_stream_bytes(needed)) if in_place else None
            try:
                try:
                    rt.driver.disks.create_layer(handle.workdir / new_top,
                                                   handle.workdir / record.top,
                                                   record.disk_bytes)
                    async with self._volumes_still(handle, vm, record, work) as kept:
                        with span("vmm.snapshot"):
                            pause = await rt.driver.snapshot_live(
                                vm, buffer or work / STREAM, handle.workdir / new_top,
                                short_pause=short_pause, overwrite=buffer is not None)
                    if buffer is not None:
                        (work / STREAM).symlink_to(buffer)
                except (SnapshotFailed, OSError) as exc:
                    if isinstance(exc, SnapshotFailed) and exc.disk_switched:
                        rt.table.save(replace(record, layers=(*record.layers, new_top)))
                    else:
                        (handle.workdir / new_top).unlink(missing_ok=True)
                    raise
                switched = True
                rt.table.save(replace(record, layers=(*record.layers, new_top)))
                link_layers(handle.workdir, work, record.layers)
                info = SnapshotInfo(
                    id=snap_id, name=name, source=sandbox_id, template=record.template,
                    template_path=record.template_path, vcpus=record.vcpus,
                    memory_mb=record.memory_mb, disk_bytes=record.disk_bytes,
                    layers=record.layers, created_at=time.time(),
                    state_bytes=pause.stream_bytes, internal=internal,
                    size_bytes=allocated_bytes(work), transient=transient, volumes=kept)
                rt.snapshots.commit(work, info)
            except BaseException as exc:
                rt.snapshots.abort(work)
                if buffer is not None:
                    rt.fork_buffer.give_back()
                if not isinstance(exc, SnapshotFailed | OSError | subprocess.CalledProcessError):
                    raise
                no_space = out_of_space(exc, rt.snapshots.root, needed)
                if isinstance(exc, SnapshotFailed):
                    exc.no_space = exc.no_space or no_space
                    raise
                raise SnapshotFailed(str(exc), disk_switched=switched,
                                     no_space=no_space) from exc
            if handle.state == "running" and resync_clock:
                # However the save went, the guest stood still for a while, its clock too.
                await handle.resync_clock(record.machine_id)
            if needs_merge(record.layers):
                await rt.start_flatten(sandbox_id, vm)
        if rt.remote is not None and not transient:
            # Outside the lifecycle lock: the snapshot's files are frozen, the sandbox may go on.
            try:
                await rt.remote.publish_snapshot(info, rt.snapshots.path(snap_id))
            except BaseException:
                # A snapshot the caller never got the id of would only take space.
                await asyncio.to_thread(rt.snapshots.delete, snap_id)
                raise
        if in_place and buffer is None:
            # For the next fork: as large as `take` will reserve, or that fork would allocate
            # the rest itself (~240 MiB of fresh pages, up to ~560 ms here, before its pause).
            rt.fork_buffer.prepare(max_stream_bytes(needed))
        return SnapshotResult(info, pause.ms, pause.method)

    @contextlib.asynccontextmanager
    async def _volumes_still(self, handle: SandboxHandle, vm: VMProcess,
                             record: SandboxRecord, work: Path
                             ) -> AsyncIterator[tuple[dict[str, Any], ...]]:
        """Around a save: a sandbox with read-write volumes is stopped first (its writes
        flushed), its volumes copied into the snapshot and the save taken in that same stop,
        so the copies are the disks its memory refers to; it runs again after the save.
        Yields what the snapshot records of its volumes."""
        rt = self.rt
        mounts = mounts_of(record.volumes)
        if not any(not m.read_only for m in mounts):
            yield rt.volumes.keep_copies(mounts, work)
            return
        was_running = handle.state == "running"
        await rt.driver.pause(vm)
        try:
            yield await asyncio.to_thread(rt.volumes.keep_copies, mounts, work)
        finally:
            if was_running:
                await rt.driver.resume(vm)

    async def fork(self, sandbox_id: str, count: int = 1) -> ForkChildren[SandboxHandle]:
        """`count` live copies of a running sandbox: memory, processes and files as they were
        at the fork instant, each with its own identity; the parent keeps running. With them,
        how long the parent stood still for the fork's snapshot."""
        rt = self.rt
        if not 1 <= count <= MAX_FORK:
            raise ValueError(f"count must be between 1 and {MAX_FORK}")
        rt.table.running(sandbox_id, "running", "paused")  # SandboxNotFound before any work
        policy = await asyncio.to_thread(NetworkPolicy.from_dict,
                                         rt.table.record(sandbox_id).network)
        # A network slot for each child, made while the parent saves (QEMU writes the stream
        # on one core): a child without a spare made its own after the save, ~20-60 ms of
        # `ip` and `nft` on its path.
        rt.slots.refill_spares(at_least=count)
        snap = await self.snapshot(sandbox_id, internal=True, transient=True,
                                   resync_clock=False)
        if count == 1:  # its only child takes the snapshot's copies of volumes, no new copy
            rt.volumes.handed_over.add(snap.info.id)
        try:
            # The parent's clock is set again while its children restore, not before.
            results = await asyncio.gather(
                *(rt.create(snapshot=snap.info.id, network=policy, forked_from=sandbox_id)
                  for _ in range(count)),
                self.resync_parent_clock(sandbox_id), return_exceptions=True)
        finally:
            # Children hold their own links to the layers: the snapshot itself can go. Gone
            # already is no failure of the fork: raising here would lose the children made.
            rt.volumes.handed_over.discard(snap.info.id)
            with contextlib.suppress(SnapshotNotFound):
                rt.delete_snapshot(snap.info.id)
        results = results[:count]
        children = [r for r in results if isinstance(r, SandboxHandle)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for child in children:
                with contextlib.suppress(HostError):
                    await rt.kill(child.id)
            raise failures[0]
        return ForkChildren(children, snap.pause_ms)

    async def resync_parent_clock(self, sandbox_id: str) -> None:
        """After a fork's save: the parent's guest clock set again, as `snapshot` does, under
        its lifecycle lock (so never on a sandbox paused or hibernated since: the agent call
        would wake it). Best effort, like `SandboxHandle.resync_clock`."""
        handle = self.rt.table.find(sandbox_id)
        if handle is None:  # killed meanwhile: no clock to set
            return
        async with handle.lifecycle_lock:
            record = self.rt.table.find_record(sandbox_id)
            if handle.state == "running" and record is not None:
                await handle.resync_clock(record.machine_id)
