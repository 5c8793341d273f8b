"""The QEMU `-M microvm` driver, all of it in this folder: the driver (driver.py), its command
line (command.py), disks (disk.py over qcow2.py), QMP (qmp.py), saves (save.py), live
migration (migrate.py), jail (jail.py) and accelerator probe (accel.py). The runtime never
imports it: it asks `vmm.factory` for its driver by name and what the driver can do by its
capabilities (`vmm.driver.Capability`)."""

from pandastack.host.vmm.qemu.command import MACHINE, DiskLimits, QemuProcesses
from pandastack.host.vmm.qemu.driver import QemuDriver

__all__ = ["MACHINE", "DiskLimits", "QemuDriver", "QemuProcesses"]
