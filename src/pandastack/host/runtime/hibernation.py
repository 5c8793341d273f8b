"""Hibernation of a host's sandboxes (`HostRuntime.hibernate`, `.wake`): the whole state
written to disk and the VM ended, then restored under the same id (here, or on another host
through the object store: ADR 0020). Volumes stay mounted across it (ADR 0027).

The wake of a sandbox whose VM died (`stopped`, ADR 0037) boots its own disk: its files are
kept, its processes are not.

Crash safety of a hibernation: the record says `hibernating` before the save starts, the
driver writes the stream to a `.partial` file and renames it only once whole, and only then
does the VM end and the record say `hibernated`. A runtime that starts after a crash anywhere
in between finds either a whole hibernation file (and adopts the sandbox hibernated) or none
(and adopts it stopped, its disk kept): `records.without_vm`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pandastack.host.memory.admission import Reservation, file_bytes
from pandastack.host.runtime.records import (
    HIBERNATING,
    HIBERNATION,
    SANDBOX_ID_RE,
    STOPPED,
    SandboxRecord,
)
from pandastack.host.runtime.remote import fetch_hibernated
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import VMPaths
from pandastack.host.volumes.attach import mounts_of
from pandastack.hostport.errors import (
    AgentError,
    SandboxNotFound,
    SandboxStateError,
    SetupError,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.tracing import span

#: What a hibernation waits for the guest to write its page cache to its disk first.
SYNC_BEFORE_SAVE_S = 30.0
#: How long a booted disk's guest may take until its agent answers (a cold boot under TCG
#: takes tens of seconds; the template bake allows the same).
BOOT_DEADLINE_S = 240.0
#: Test hook: a process with this variable set to a crash point's name exits there at once,
#: as a SIGKILL would end it (tests/e2e/test_persistent_vm_death.py).
CRASH_AT_ENV = "PANDASTACK_TEST_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_AT_ENV) == name:
        os._exit(137)

if TYPE_CHECKING:
    from pandastack.host.runtime.parts import RuntimeParts


class Hibernation:
    def __init__(self, rt: RuntimeParts):
        self.rt = rt
        self._fetching: dict[str, asyncio.Lock] = {}

    async def hibernate(self, sandbox_id: str) -> None:
        """Write the sandbox's whole state to disk and end its VM, freeing RAM and CPU."""
        rt = self.rt
        handle, vm = rt.table.running(sandbox_id, "running", "paused")
        async with handle.lifecycle_lock:
            await rt.settle_flatten(sandbox_id, vm)
            # Its volumes get what the guest wrote so far: a kill of the hibernated
            # sandbox (which never runs its guest again) then loses nothing of it.
            mounts = mounts_of(rt.table.record(sandbox_id).volumes)
            await rt.volumes.flush(rt.driver, handle, mounts)
            if handle.state == "running":
                # Its disk gets what the guest wrote so far too: a hibernation cut short by
                # a crash falls back to booting that disk (ADR 0037), and files written just
                # before would otherwise be only in the lost guest's page cache.
                with contextlib.suppress(AgentError, asyncio.TimeoutError):
                    await asyncio.wait_for((await handle.agent()).sync(), SYNC_BEFORE_SAVE_S)
            await handle.disconnect()
            before = rt.table.record(sandbox_id)
            rt.table.save(replace(before, state=HIBERNATING))
            crash_point("hibernate-before-save")
            try:
                with span("vmm.save"):
                    await rt.driver.save_stopped(vm, handle.workdir / HIBERNATION)
            except BaseException:
                rt.table.save(before)
                if before.state == "running":  # the save stopped the guest first
                    try:
                        await rt.driver.resume(vm)
                    except Exception as exc:
                        rt.progress(f"sandbox {sandbox_id}: resume after a failed "
                                    f"hibernation failed: {exc}")
                raise
            # Hibernated, as a lookup sees it, before the kill's wait: the state is saved, and
            # another API server's reaper looking during that wait found a running sandbox
            # without a live VM and stopped it (its in-transition mark is this server's own).
            handle.vm = None
            handle.state = "hibernated"
            await asyncio.to_thread(vm.kill)
            crash_point("hibernate-after-vm-ended")
            rt.vm_ended(handle.workdir)
            record = rt.table.save(replace(before, state="hibernated", pid=None))
            if rt.remote is not None:
                # Under the lock: a wake would write to the top layer being uploaded. A
                # failure leaves the sandbox hibernated here, but not in the store.
                writer = await rt.remote.publish_sandbox(record, handle.workdir)
                rt.table.save(replace(record, in_store=True, store_writer=writer))

    async def wake(self, sandbox_id: str) -> None:
        """Restore a hibernated sandbox; boot the disk of one whose VM died; a no-op for one
        that is awake. With an object store, a sandbox this host does not know is fetched
        from there first (it was hibernated on another host) and is this host's from then
        on."""
        rt = self.rt
        if sandbox_id not in rt.table and rt.remote is not None:
            await self._fetch_hibernated(sandbox_id)
        handle = rt.table.get(sandbox_id)
        async with handle.lifecycle_lock:
            if handle.state != "hibernated":
                if handle.state == STOPPED or not handle.is_alive():
                    await self._boot_disk(handle)
                return
            record = rt.table.record(sandbox_id)
            store = await rt.prepare()
            tmpl = store.load_dir(record.template, Path(record.template_path))
            stream = handle.workdir / HIBERNATION
            files = replace(tmpl.snapshot, device_state=stream, memory=None)
            # Held until the agent answers: the whole stream is loaded into the VM by then.
            with rt.admission.vm_start(f"wake {sandbox_id}", rt.driver.accel,
                                       file_bytes(stream)) as reservation:
                vm = await rt.restore_vm(
                    VMPaths(handle.workdir), files, handle.workdir / record.top,
                    await self._network(record),
                    rt.volumes.drives(rt.driver, handle.workdir, mounts_of(record.volumes)))
                handle.vm = vm
                handle.state = "running"
                try:
                    await handle.initialize(record.machine_id)
                except BaseException:
                    await asyncio.to_thread(vm.kill)
                    rt.vm_ended(handle.workdir)
                    handle.vm = None
                    handle.state = "hibernated"
                    raise
                _up(handle, reservation)
            rt.table.save(replace(record, state="running", pid=vm.pid))
            stream.unlink(missing_ok=True)

    async def _boot_disk(self, handle: SandboxHandle) -> None:
        """(Under the lifecycle lock.) Cold-boot the guest kernel on the sandbox's own disk
        (the top layer over its chain) after its VM died: the files it wrote are there, its
        memory and processes are not. On failure it stays stopped, its disk untouched."""
        rt = self.rt
        record = rt.table.record(handle.id)
        if record.volumes:
            # Their drives are attached and mounted only by a create (or kept in a restored
            # memory); a booted guest would run without them.
            raise SandboxStateError(f"sandbox {handle.id} is stopped with volumes mounted; "
                                    "booting its disk without them is not supported")
        if handle.vm is not None:
            await handle.disconnect()
            await asyncio.to_thread(handle.vm.kill)
        rt.vm_ended(handle.workdir)
        handle.vm, handle.state = None, STOPPED
        (handle.workdir / HIBERNATION).unlink(missing_ok=True)  # older than the disk now
        rt.table.save(replace(record, state=STOPPED, pid=None))
        store = await rt.prepare()
        tmpl = store.load_dir(record.template, Path(record.template_path))
        netns = await self._network(record)
        # A cold boot's RAM is fresh anonymous memory the guest fills as it likes (not
        # measured): counted whole, on this rare path.
        with rt.admission.vm_start(f"boot {handle.id}", rt.driver.accel,
                                   tmpl.snapshot.shape.memory_mb << 20) as reservation:
            vm = await asyncio.to_thread(rt.driver.boot, VMPaths(handle.workdir),
                                         tmpl.snapshot.kernel, handle.workdir / record.top,
                                         None, tmpl.snapshot.shape, netns=netns)
            handle.vm, handle.state = vm, "running"
            try:
                await _first_contact(handle, record.machine_id)
            except BaseException:
                await handle.disconnect()
                await asyncio.to_thread(vm.kill)
                rt.vm_ended(handle.workdir)
                handle.vm, handle.state = None, STOPPED
                raise
            _up(handle, reservation)
        rt.table.save(replace(record, state="running", pid=vm.pid))

    async def _network(self, record: SandboxRecord) -> str | None:
        """The network namespace of the sandbox's slot, built again with its policy if it
        is gone: a host reboot empties /run/netns, while the slot's claim (on disk) is
        still the sandbox's."""
        rt = self.rt
        if record.slot is None:
            return None
        slot = rt.slots.slot(record.slot)
        if not Path(slot.netns_path).exists():
            rt.progress(f"sandbox {record.id}: its network namespace {slot.netns} is gone "
                        "(a host reboot?): made again")
            await asyncio.to_thread(rt.network.setup, slot,
                                    NetworkPolicy.from_dict(record.network))
        return slot.netns

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
            if sandbox_id not in rt.table:
                record = await fetch_hibernated(rt.remote, rt.slots,
                                                rt.sandboxes_dir / sandbox_id)
                rt.adopt(rt.table.save(record), None)
                rt.slots.refill_spares()



async def _first_contact(handle: SandboxHandle, machine_id: str) -> None:
    """Until the booting guest's agent answers its first call (it starts late in the boot)."""
    deadline = time.monotonic() + BOOT_DEADLINE_S
    while True:
        vm = handle.vm
        if vm is None or not vm.is_alive():
            said = _tail(vm.paths.vmm_log) if vm is not None else ""
            raise SetupError(f"sandbox {handle.id}: the VM exited while its disk booted"
                             + (f": {said}" if said else ""))
        try:
            await handle.initialize(machine_id)
            return
        except Exception as exc:
            await handle.disconnect()
            if time.monotonic() > deadline:
                raise SetupError(f"sandbox {handle.id}: its guest agent did not answer within "
                                 f"{BOOT_DEADLINE_S:.0f} s of booting its disk: {exc}") from exc
        await asyncio.sleep(0.5)


def _tail(path: Path, limit: int = 300) -> str:
    """The VMM's last words (why it would not start), on one line."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])[-limit:]
    except OSError:
        return ""


def _up(handle: SandboxHandle, reservation: Reservation) -> None:
    """The VM is up: of its memory reservation, only what its first command takes stays."""
    handle.on_first_command = reservation.up(str(handle.workdir))
