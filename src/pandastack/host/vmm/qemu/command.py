"""The QEMU command line and what reads it back: the version and machine of the binary,
the volume slots' drives, the block throttling and the VMM processes recognised in /proc by
their arguments (adoption after a restart, garbage collection)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.vmm.driver import VMPaths, VolumeDrive, volume_serial
from pandastack.hostport.errors import VMMError

# What QEMU says when it cannot reserve hugetlb pages for a VM's RAM.
NO_HUGE_PAGES = "unable to map backing store for guest RAM"
# Before QEMU 9.0, a pre-copy migration under TCG loses guest writes: the dirty-bitmap sync
# clears the bitmap 64 pages at a time without resetting the TCG TLB, so stores through entries
# that were already marked dirty set no bit again, and a page sent while the guest ran stays
# stale in the stream (fixed upstream by 03bfc2188f, "physmem: Fix migration dirty bitmap
# coherency with TCG memory access"). Restored copies of such a stream crash or hang.
TCG_PRECOPY_FIXED = (9, 0)
# `-name` of every VM pandastack starts, followed by its work directory's name.
VM_NAME_PREFIX = "pandastack,process=pandastack-vm-"
# The agent chardev names the VM's directory: `socket,id=agent,path=<workdir>/agent.sock,...`.
AGENT_SOCKET_RE = re.compile(r"path=([^,]+/agent\.sock)")


@functools.cache
def qemu_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise VMMError(f"cannot run {binary}: {exc}") from exc
    return out.stdout.splitlines()[0].strip()


def parse_release(version: str) -> tuple[int, int]:
    """(major, minor) from `qemu --version`'s first line; (0, 0) if it names none."""
    match = re.search(r"version (\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


class QemuProcesses:
    """`VMMProcesses` of QEMU: any `qemu*` binary; pandastack's VMs carry `VM_NAME_PREFIX`."""

    def is_vmm(self, argv: Sequence[str]) -> bool:
        return bool(argv) and "qemu" in Path(argv[0]).name

    def vm_workdir(self, argv: Sequence[str]) -> Path | None:
        if not self.is_vmm(argv) or not any(a.startswith(VM_NAME_PREFIX) for a in argv):
            return None
        for arg in argv:
            match = AGENT_SOCKET_RE.search(arg)
            if match is not None:
                return Path(match.group(1)).parent
        return None


# The machine every VM runs on; with ",pit=off" under TCG (ADR 0040).
MACHINE = "microvm,memory-backend=ram,x-option-roms=off"
# How identity() named MACHINE (the PIT included) before it spelled the machine out.
MACHINE_BEFORE_IDENTITY = "microvm-v1"


@dataclass(frozen=True)
class DiskLimits:
    """What QEMU's block throttling lets one VM's drive do, per vCPU (0: no limit). In QEMU,
    not the host's cgroup: it holds whatever I/O scheduler the host's disk has (io.weight
    does nothing under `none` or mq-deadline, the usual ones for virtual disks)."""

    mbps_per_vcpu: int
    iops_per_vcpu: int

    def drive_options(self, vcpus: int) -> str:
        options = ""
        if self.mbps_per_vcpu:
            options += f",throttling.bps-total={self.mbps_per_vcpu * vcpus << 20}"
        if self.iops_per_vcpu:
            options += f",throttling.iops-total={self.iops_per_vcpu * vcpus}"
        return options


def volume_drive(slot: int) -> str:
    return f"vol{slot}"


def volume_slot_args(paths: VMPaths, volumes: Mapping[int, VolumeDrive],
                      slots: int, options: str = "") -> list[str]:
    """Every volume slot, in slot order (the virtio-mmio order must not change): the volume
    attached to it, or the VM's empty placeholder."""
    if any(slot >= slots for slot in volumes):
        raise ValueError(f"this host's VMs have {slots} volume slots")
    args: list[str] = []
    for slot in range(slots):
        drive = volumes.get(slot)
        if drive is None:
            placeholder = paths.empty_slot(slot)
            if not placeholder.exists():
                paths.workdir.mkdir(parents=True, exist_ok=True)
                placeholder.touch(mode=0o600)
            image, fmt = placeholder, "raw"
        else:
            image, fmt = drive.image, "qcow2" if drive.layered else "raw"
        # Always writable: a read-only drive would offer the guest virtio-blk's RO feature,
        # which the template's guest never negotiated (the restore would refuse the
        # stream), and QEMU refuses to announce a read-only image's size.
        # discard=unmap: blocks the guest frees become holes again, so the image (and every
        # copy a snapshot or fork makes of it) holds what the file system uses, not all it
        # ever wrote.
        args += ["-drive", f"id={volume_drive(slot)},file={image},format={fmt},if=none,"
                           f"discard=unmap{options}",
                 "-device", f"virtio-blk-device,drive={volume_drive(slot)},"
                            f"serial={volume_serial(slot)}"]
    return args


PR_SET_THP_DISABLE, PR_GET_THP_DISABLE = 41, 42


@contextlib.contextmanager
def huge_pages_inherited(allowed: bool) -> Iterator[None]:
    """Processes started inside start with transparent huge pages off unless `allowed`.

    The flag is per process, inherited across fork and kept across execve (nsenter passes it
    on to QEMU); this process holds it only while it starts the child. Every VMM is started
    from the event loop's thread, so no other VMM start sees it."""
    if allowed:
        yield
        return
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    before = prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0)
    if before < 0 or prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        yield  # not this kernel: only memory is at stake
        return
    try:
        yield
    finally:
        prctl(PR_SET_THP_DISABLE, before, 0, 0, 0)
