"""The QEMU driver's jail (ADR 0036): what a QEMU process may still do once it runs a guest.

QEMU starts as root, inside its sandbox's network namespace, and opens everything it needs
there (tap, kernel, initrd, disk chain, volume images, memory backend, console log, the QMP
and agent sockets, the inherited device-state descriptor). Just before the guest runs it
chroots into the VM's empty jail directory and becomes the VM's own uid (`-chroot`,
`-runas uid:gid`), with no capabilities, no new privileges and QEMU's seccomp filter. After
that every file it gets is a descriptor the host hands it over QMP (streams, a snapshot's new
top layer). It runs in its own cgroup (cgroups.py), sized by the machine.

The uid is `uid_base + network slot`: slots are unique per network namespace (ADR 0021), so
no two live VMs there share a uid, and one cannot signal, ptrace or read the other.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.vmm import cgroups
from pandastack.host.vmm.driver import MachineShape, VMPaths

# elevateprivileges=deny would also refuse QEMU's own setuid at -runas (QEMU 7.2 installs the
# filter before it drops), so set*id stay allowed: after the drop the process holds no
# capability and no_new_privs, and spawn=deny refuses execve, so they cannot raise anything.
SECCOMP = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"
JAIL_DIR = "jail"
# Measured (bench/jail.py): a 512 MiB sandbox's QEMU peaks at ~96 MiB charged after create
# and a first exec; the limit leaves that and a margin beside guest RAM and the translation
# buffer. A stream a snapshot or fork writes into tmpfs is charged to the QEMU writing it and
# cannot be reclaimed without swap: another guest RAM's worth (limits_for).
OVERHEAD_MB = 160
# QEMU's threads: one per vCPU, its main loop, RCU, and the block layer's pool (up to 64).
PIDS_MAX = 256
UNSLOTTED = 65535  # a VM with no network namespace (none today: QEMU VMs all have a tap)


@dataclass(frozen=True)
class JailSettings:
    uid_base: int = 200_000
    overhead_mb: int = OVERHEAD_MB
    tb_size_mb: int = 64
    pids: int = PIDS_MAX
    io_weight: int | None = 100


@dataclass(frozen=True)
class Jail:
    uid: int
    root: Path  # the chroot: an empty directory of the VM's uid, mode 0700
    cgroup: str
    cgroup_dirs: tuple[Path, ...]

    def qemu_args(self) -> list[str]:
        return ["-runas", f"{self.uid}:{self.uid}", "-chroot", str(self.root),
                "-sandbox", SECCOMP]


def slot_of(netns: str | None) -> int | None:
    match = re.search(r"(\d+)$", netns or "")
    return int(match.group(1)) if match else None


def uid_for(netns: str | None, base: int) -> int:
    slot = slot_of(netns)
    return base + (UNSLOTTED if slot is None else slot)


def limits_for(shape: MachineShape, settings: JailSettings) -> cgroups.Limits:
    memory_mb = 2 * shape.memory_mb + settings.tb_size_mb + settings.overhead_mb
    return cgroups.Limits(vcpus=shape.vcpus, memory_bytes=memory_mb << 20,
                          pids=settings.pids, io_weight=settings.io_weight)


def prepare(paths: VMPaths, shape: MachineShape, netns: str | None,
            settings: JailSettings) -> Jail:
    """Root's work before the VMM starts: its chroot and its cgroup."""
    uid = uid_for(netns, settings.uid_base)
    root = paths.workdir / JAIL_DIR
    # A directory an earlier VMM of another uid left (before a wake) is made again, empty.
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o700, parents=True)
    os.chown(root, uid, uid)
    os.chmod(root, 0o700)
    name = cgroups.cgroup_name(paths.workdir)
    cgroups.remove(name, wait_s=0)  # a dead predecessor's limits
    dirs = cgroups.create(name, limits_for(shape, settings))
    return Jail(uid, root, name, tuple(dirs))


def enter(jail: Jail, pid: int) -> None:
    """Put the just-started VMM in its cgroup (before it maps guest RAM: QEMU does that when
    the stream loads, after its sockets answer)."""
    cgroups.join(list(jail.cgroup_dirs), pid)


def release(workdir: Path) -> None:
    """After the VMM is gone: its cgroup (the jail directory goes with the work directory)."""
    with contextlib.suppress(OSError):
        cgroups.remove(cgroups.cgroup_name(workdir))


UNPRIVILEGED_USERFAULTFD = Path("/proc/sys/vm/unprivileged_userfaultfd")


def allow_userfaultfd() -> bool:
    """Let processes without CAP_SYS_PTRACE make userfaultfds (host-wide sysctl): a background
    snapshot (ADR 0008) write-protects guest RAM with one, which QEMU 7.2 creates only after
    it dropped to the VM's uid (by the system call; /dev/userfaultfd, which a file mode could
    grant, is QEMU 8.1's). Without it, TCG snapshots stop the guest for the whole save.
    True if it is allowed now."""
    try:
        if UNPRIVILEGED_USERFAULTFD.read_text().strip() != "1":
            UNPRIVILEGED_USERFAULTFD.write_text("1")
        return True
    except OSError:
        return False


def usable() -> bool:
    """The jail needs root (to chroot and drop to another uid) and writable cgroups."""
    return os.geteuid() == 0 and cgroups.available()
