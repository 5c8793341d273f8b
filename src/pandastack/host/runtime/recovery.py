"""What a runtime starting after a crash does with the VMs it finds running (`HostRuntime
.start`): the process that drove them may have died in the middle of an operation.

- A VM under a `running` or `paused` record may be stopped for a save, or streaming a fork's,
  a snapshot's or a migration's state: the operation is cancelled and its vCPUs run (or stay
  stopped) as the record says (`driver.settle`). Without this a server killed during a fork
  left the source stopped for good, and every call timed out on its agent.
- A VM under a `hibernated` record is a wake cut short (the record says `running` only once
  the woken guest answered): once settled, it gets the first contact a wake gives it and the
  record says `running`; the hibernation file, older than its disk from then on, goes.
  Without this the sandbox stayed `hibernated` beside its live VM, and a wake restored a
  second VM onto the same sockets.
- A VM that cannot be settled (still loading the state it was restored from, or not
  answering) is ended; the sandbox is then what its files say (`records.without_vm`:
  hibernated if the hibernation file is whole, else stopped, its disk kept).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING

from pandastack.host.runtime.records import HIBERNATION, SandboxRecord, without_vm
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import VMProcess

if TYPE_CHECKING:
    from pandastack.host.runtime.parts import RuntimeParts

#: What settling one VM (QMP: cancel a migration, cont or stop) may take.
SETTLE_S = 20.0
#: What the first contact with the guest of a wake cut short may take.
CONTACT_S = 60.0


async def settle_adopted(rt: RuntimeParts, record: SandboxRecord,
                         vm: VMProcess) -> tuple[SandboxRecord, VMProcess | None]:
    """The record and VM to adopt: `vm` settled, or None (ended) and the record without it."""
    workdir = rt.sandboxes_dir / record.id
    try:
        await asyncio.wait_for(rt.driver.settle(vm, record.state != "paused"), SETTLE_S)
        return record, vm
    except Exception as exc:  # whatever it is, the VM is not usable: the files decide
        rt.progress(f"sandbox {record.id}: its VM could not be settled after a restart "
                    f"({type(exc).__name__}: {exc}); ended")
    await asyncio.to_thread(vm.kill)
    rt.vm_ended(workdir)
    return without_vm(record, workdir), None


async def finish_wake(rt: RuntimeParts, handle: SandboxHandle, record: SandboxRecord) -> None:
    """(A settled VM under a `hibernated` record.) Give it the wake's first contact and record
    it running; end it (hibernated or stopped, as its files say) if the guest does not
    answer."""
    assert handle.vm is not None
    handle.state = "running"
    try:
        await asyncio.wait_for(handle.initialize(record.machine_id), CONTACT_S)
    except Exception as exc:
        rt.progress(f"sandbox {record.id}: the guest of an interrupted wake did not answer "
                    f"({type(exc).__name__}: {exc}); ended")
        await handle.disconnect()
        await asyncio.to_thread(handle.vm.kill)
        rt.vm_ended(handle.workdir)
        ended = rt.table.save(without_vm(record, handle.workdir))
        handle.vm, handle.state = None, ended.state
        return
    rt.table.save(replace(record, state="running", pid=handle.vm.pid))
    (handle.workdir / HIBERNATION).unlink(missing_ok=True)
