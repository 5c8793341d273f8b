"""VMM drivers by name: `HostConfig.vmm` (PANDASTACK_VMM, default "qemu") picks a runtime's.

A driver is registered here with how to make it for a host and how to recognise its processes;
the runtime asks `driver_for` and never names a driver itself. Garbage collection is host-wide,
so it recognises the processes of every registered driver (`is_vmm_process`, `vm_workdir`),
whichever one this runtime uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.config import HostConfig
from pandastack.host.vmm.driver import KernelSpec, VMMDriver, VMMProcesses
from pandastack.host.vmm.qemu import DiskLimits, QemuDriver, QemuProcesses, jail
from pandastack.host.vmm.qemu.accel import resolve_accel
from pandastack.hostport.errors import SetupError

# (config, a guest kernel the driver may boot to probe the host, whether the host hands
# freed memory back to its own hypervisor) -> a driver ready for this host.
DriverMaker = Callable[[HostConfig, KernelSpec, bool], VMMDriver]


@dataclass(frozen=True)
class DriverKind:
    make: DriverMaker
    processes: VMMProcesses


def _qemu(config: HostConfig, kernel: KernelSpec, reports_free_pages: bool) -> VMMDriver:
    if not config.networking:
        # Every QEMU machine has a NIC on a tap in its sandbox's namespace, and templates
        # are baked with it: without networking there is no tap to attach to.
        raise SetupError("the qemu driver needs networking (HostConfig.networking)")
    accel = resolve_accel(config.accel, kernel, config.cache_dir, config.qemu_binary)
    huge = config.stream_huge_pages
    if huge == "auto":
        huge = "off" if reports_free_pages else "on"
    cell = None
    if config.jail and jail.usable():
        cell = jail.JailSettings(uid_base=config.jail_uid_base, tb_size_mb=config.tb_size_mb)
        if config.jail_userfaultfd:
            jail.allow_userfaultfd()
    return QemuDriver(accel, binary=config.qemu_binary, tb_size_mb=config.tb_size_mb,
                      tcg_cpu=config.tcg_cpu, stream_huge_pages=huge == "on",
                      volume_slots=config.volume_slots, jail=cell,
                      disk_limits=DiskLimits(config.disk_mbps_per_vcpu,
                                             config.disk_iops_per_vcpu))


_KINDS: dict[str, DriverKind] = {"qemu": DriverKind(_qemu, QemuProcesses())}


def register(name: str, kind: DriverKind) -> None:
    """Make a driver known by `name` (a driver that lives outside this package)."""
    _KINDS[name] = kind


def known_drivers() -> list[str]:
    return sorted(_KINDS)


def driver_for(name: str, config: HostConfig, kernel: KernelSpec, *,
               reports_free_pages: bool = False) -> VMMDriver:
    """The driver called `name`, set up for this host (may boot `kernel` once to probe the
    accelerator: call it off the event loop). SetupError for a name no driver has."""
    kind = _KINDS.get(name)
    if kind is None:
        raise SetupError(f"unknown VMM driver {name!r} (PANDASTACK_VMM); known drivers: "
                         + ", ".join(known_drivers()))
    return kind.make(config, kernel, reports_free_pages)


def is_vmm_process(argv: Sequence[str]) -> bool:
    """Whether `argv` runs the VMM of any known driver (for any VM, pandastack's or not)."""
    return any(kind.processes.is_vmm(argv) for kind in _KINDS.values())


def vm_workdir(argv: Sequence[str]) -> Path | None:
    """The work directory of the pandastack VM whose VMM `argv` runs, whichever driver's."""
    for kind in _KINDS.values():
        workdir = kind.processes.vm_workdir(argv)
        if workdir is not None:
            return workdir
    return None
