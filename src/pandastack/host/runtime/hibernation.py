"""Hibernation of a host's sandboxes (`HostRuntime.hibernate`, `.wake`): the whole state
written to disk and the VM ended, then restored under the same id (here, or on another host
through the object store: ADR 0020). Volumes stay mounted across it (ADR 0027)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pandastack.host.runtime.records import HIBERNATION, SANDBOX_ID_RE
from pandastack.host.runtime.remote import fetch_hibernated
from pandastack.host.vmm.driver import VMPaths
from pandastack.host.volumes.attach import mounts_of
from pandastack.hostport.errors import SandboxNotFound

if TYPE_CHECKING:
    from pandastack.host.runtime.core import HostRuntime


class Hibernation:
    def __init__(self, rt: HostRuntime):
        self.rt = rt
        self._fetching: dict[str, asyncio.Lock] = {}

    async def hibernate(self, sandbox_id: str) -> None:
        """Write the sandbox's whole state to disk and end its VM, freeing RAM and CPU."""
        rt = self.rt
        handle, vm = rt._running(sandbox_id, "running", "paused")
        async with handle.lifecycle_lock:
            await rt._settle_flatten(sandbox_id, vm)
            # Its volumes get what the guest wrote so far: a kill of the hibernated
            # sandbox (which never runs its guest again) then loses nothing of it.
            await rt.volumes.flush(rt.driver, handle, mounts_of(rt._records[sandbox_id].volumes))
            await handle.disconnect()
            await rt.driver.save_stopped(vm, handle.workdir / HIBERNATION)
            await asyncio.to_thread(vm.kill)
            rt._vm_ended(handle.workdir)
            handle.vm = None
            handle.state = "hibernated"
            record = rt._save(replace(rt._records[sandbox_id], state="hibernated",
                                        pid=None))
            if rt.remote is not None:
                # Under the lock: a wake would write to the top layer being uploaded. A
                # failure leaves the sandbox hibernated here, but not in the store.
                writer = await rt.remote.publish_sandbox(record, handle.workdir)
                rt._save(replace(record, in_store=True, store_writer=writer))

    async def wake(self, sandbox_id: str) -> None:
        """Restore a hibernated sandbox; a no-op for one that is awake. With an object store,
        a sandbox this host does not know is fetched from there first (it was hibernated on
        another host) and is this host's from then on."""
        rt = self.rt
        if sandbox_id not in rt._sandboxes and rt.remote is not None:
            await self._fetch_hibernated(sandbox_id)
        handle = rt.get(sandbox_id)
        async with handle.lifecycle_lock:
            if handle.state != "hibernated":
                return
            record = rt._records[sandbox_id]
            store = await rt.prepare()
            tmpl = store.load_dir(record.template, Path(record.template_path))
            stream = handle.workdir / HIBERNATION
            files = replace(tmpl.snapshot, device_state=stream, memory=None)
            vm = await rt._restore(
                VMPaths(handle.workdir), files, handle.workdir / record.top,
                rt.slots.slot(record.slot).netns if record.slot is not None else None,
                rt.volumes.drives(rt.driver, handle.workdir, mounts_of(record.volumes)))
            handle.vm = vm
            handle.state = "running"
            try:
                await handle.initialize(record.machine_id)
            except BaseException:
                await asyncio.to_thread(vm.kill)
                rt._vm_ended(handle.workdir)
                handle.vm = None
                handle.state = "hibernated"
                raise
            rt._save(replace(record, state="running", pid=vm.pid))
            stream.unlink(missing_ok=True)

    async def fetch_hibernated(self, sandbox_id: str) -> None:
        """A sandbox hibernated on another host, laid out here hibernated (no VM yet): the
        agent leases it between this and the wake. SandboxNotFound without a store."""
        rt = self.rt
        if rt.remote is None:
            raise SandboxNotFound(sandbox_id)
        await self._fetch_hibernated(sandbox_id)

    async def _fetch_hibernated(self, sandbox_id: str) -> None:
        rt = self.rt
        assert rt.remote is not None
        if not SANDBOX_ID_RE.match(sandbox_id):
            raise SandboxNotFound(sandbox_id)
        async with self._fetching.setdefault(sandbox_id, asyncio.Lock()):
            if sandbox_id not in rt._sandboxes:
                record = await fetch_hibernated(rt.remote, rt.slots,
                                                rt.sandboxes_dir / sandbox_id)
                rt._adopt(rt._save(record), None)
                rt.slots.refill_spares()

