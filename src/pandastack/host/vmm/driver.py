"""The VMM driver interface: everything the runtime needs from a hypervisor, and nothing more.

A driver cold-boots a VM (only to bake a template), saves a booted VM as a template snapshot,
and restores VMs from such snapshots. Memory of a snapshot lives in one file that every clone
maps privately (copy-on-write); device state is a small separate file; the disk is a
copy-on-write layer chain in the driver's own format (`DiskLayers`). QEMU implements this
today; a Firecracker driver maps onto the same calls (its snapshot is also a memory file plus a
small vmstate file; its disks raw images copied by reflink instead of a backing chain).

Everything specific to one VMM stays behind these protocols: its command line and control
socket, its disk format and tools, and how its processes look in /proc (adoption after a
restart, garbage collection). The runtime gets its driver by name (`vmm.factory`).

Not every VMM can do everything the runtime offers: a driver declares what it can beyond the
calls every driver must answer as `capabilities` (`Capability`), and the runtime asks before it
relies on one (`require`, or a slower path where there is one: ADR 0043).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from pandastack.host.vmm import cgroups
from pandastack.hostport.errors import SandboxStateError, VMMError
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_VCPUS, MAX_VOLUMES_PER_SANDBOX

AGENT_PORT_NAME = "org.pandastack.agent"
# Disk slots every VM has for durable volumes (ADR 0027). A machine without hot-plug keeps its
# device set from boot to every restore, so templates are baked with the slots empty and a
# restore chooses what backs each one. Slot i's disk carries the serial `volume_serial(i)`.
VOLUME_SLOTS = MAX_VOLUMES_PER_SANDBOX


def volume_serial(slot: int) -> str:
    return f"pandastack-vol{slot}"


class Capability(Enum):
    """What a driver may or may not be able to do; what each one gates in the runtime is in
    ADR 0043. The value is how an error names it to a user."""

    # `start_incoming` ... `finish_incoming`, `migrate_out`, `resume_source`: a sandbox moves
    # to another host while it runs. Without it a migration is refused (a drain then moves
    # the sandbox cold: hibernated here, woken there).
    LIVE_MIGRATION = "live migration"
    # `disks.start_flatten` / `settle_flatten`: a running VM's layers merged into its top.
    # Without it the chain keeps every snapshot's layer.
    LAYER_FLATTENING = "disk layer flattening"
    # `snapshot_live(short_pause=True)` keeps the guest's pause short even where the save
    # takes longer. Without it a snapshot stops the guest for the whole save; one that asks
    # for a short pause by name is refused.
    SHORT_PAUSE_SAVES = "short-pause snapshots"
    # `snapshot_live(overwrite=True)`: a fork's stream written into the warm fork buffer.
    # Without it a fork's stream is a new file in the snapshot's directory.
    STREAM_IN_PLACE = "saves into a warm buffer"
    # `restore(hugetlb=True)`: RAM from the host's hugetlb pool. Without it: ordinary pages.
    HUGETLB_RAM = "hugetlb guest RAM"
    # `resize_disk`: a create grows the root disk. Without it a create asking for a larger
    # disk than its template's is refused.
    DISK_RESIZE = "root disk resize"


class CapabilityMissing(SandboxStateError):
    """The host's VMM driver cannot do what the operation needs. A SandboxStateError, so the
    host port and the REST API answer it as one (409 conflict), with this message."""

    def __init__(self, driver: str, capability: Capability, operation: str):
        super().__init__(f"{operation} is not supported on this host: its VMM driver "
                         f"{driver!r} has no {capability.value}")
        self.driver = driver
        self.capability = capability
        self.operation = operation


@dataclass(frozen=True)
class VolumeDrive:
    """The image backing one volume slot of a VM: a volume's raw image, or (`layered`) an
    overlay in the driver's disk format over one, which is how a read-only mount reaches
    it (the guest's writes, if any, stay in the overlay)."""

    image: Path
    layered: bool = False


@dataclass(frozen=True)
class MachineShape:
    vcpus: int = DEFAULT_VCPUS
    memory_mb: int = DEFAULT_MEMORY_MB


@dataclass(frozen=True)
class KernelSpec:
    kernel: Path
    initrd: Path
    cmdline: str


@dataclass(frozen=True)
class SnapshotFiles:
    """A saved VM: `memory` is mapped privately by every clone and must never change; None
    means the device-state stream carries all of the memory itself (snapshots of clones)."""

    memory: Path | None
    device_state: Path
    kernel: KernelSpec
    shape: MachineShape
    # `identity()` of the driver that baked the template this descends from (template.json's
    # "driver"): a driver whose machine has changed since restores into the one it names.
    saved_by: str = ""


def max_stream_bytes(ram_bytes: int) -> int:
    """An upper bound of a saved VM's stream for this much guest RAM: each 4 KiB page at most
    once, with its header, plus device state."""
    return ram_bytes + ram_bytes // 256 + (16 << 20)


@dataclass(frozen=True)
class SnapshotPause:
    """How a live snapshot stopped its guest: for how long, and how it saved the memory:
    "precopy" (while the guest ran), "background" (write-protected, saved while the guest
    ran) or "stopped" (the guest was stopped for the whole save)."""

    ms: float
    method: str
    stream_bytes: int = 0  # how much of the stream file the save wrote


@dataclass(frozen=True)
class MigrationStats:
    """How a live migration went on the source: the guest's pause (QEMU's `downtime` of a
    pre-copy, or the whole transfer where the guest was stopped first), the time from the
    start to the source's stop, the bytes of memory sent and how ("precopy" or "stopped")."""

    downtime_ms: float
    total_ms: float
    bytes: int
    method: str


@dataclass(frozen=True)
class VMPaths:
    """The files one VM owns, all inside its work directory (removed whole on kill)."""

    workdir: Path

    @property
    def agent_socket(self) -> Path:
        return self.workdir / "agent.sock"

    @property
    def console_log(self) -> Path:
        """The guest's serial console. A VMM opens it O_APPEND: the runtime trims it under a
        writing guest (runtime/console.py)."""
        return self.workdir / "console.log"

    @property
    def vmm_log(self) -> Path:
        return self.workdir / "vmm.log"

    def empty_slot(self, slot: int) -> Path:
        """What backs a volume slot nothing is attached to: an empty file of the VM's own
        (writable, as at the bake, whose device features every restore must offer again)."""
        return self.workdir / f"slot{slot}.empty"


class VMProcess:
    """A running VMM process. It may be our child or one adopted after a host restart."""

    def __init__(self, pid: int, paths: VMPaths, popen: subprocess.Popen[bytes] | None = None):
        self.pid = pid
        self.paths = paths
        self._popen = popen
        # Set by drivers that connect to the agent port before the guest resumes.
        self.agent_connection: socket.socket | None = None

    def is_alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_is_running(self.pid) and self._still_ours()

    def exit_status(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL the VMM and wait until the process is gone (reaped when it is our child);
        then remove the VM's cgroup, if its driver made one (ADR 0036)."""
        try:
            self._kill(timeout)
        finally:
            with contextlib.suppress(OSError):
                cgroups.remove(cgroups.cgroup_name(self.paths.workdir))

    def _kill(self, timeout: float) -> None:
        if self._popen is None and not self._still_ours():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=timeout)
            return
        deadline = time.monotonic() + timeout
        while pid_is_running(self.pid) and time.monotonic() < deadline:
            time.sleep(0.005)

    def _still_ours(self) -> bool:
        # An adopted VMM is not our child: after it died its pid may belong to another
        # process by now. Only a process whose command line names our files is ours.
        return any(str(self.paths.workdir) + "/" in arg for arg in read_cmdline(self.pid))


def pid_is_running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (an exited process nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(b")", 1)[-1].split()[0]
    return state not in (b"Z", b"X")


def iter_cmdlines() -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every process that has a command line (zombies and kernel threads
    have none)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            argv = read_cmdline(int(proc.name))
            if argv:
                yield int(proc.name), argv


def read_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class DiskLayers(Protocol):
    """A VM's root disk: a chain of copy-on-write layer files in the driver's own format.

    The runtime names the layer files (each ends in `suffix`), keeps their order in its
    records and links them between directories (snapshots and forks share layers so, without
    copies); the driver writes and reads them. The bottom of every chain is a template's disk,
    made once over the guest image's raw ext4 rootfs."""

    suffix: str  # the end of every layer file's name (the runtime names the files)

    def create_base(self, path: Path, rootfs: Path) -> None:
        """Make a template's disk at `path`: an empty layer over the raw image `rootfs`."""
        ...

    def create_layer(self, path: Path, parent: Path, size_bytes: int) -> None:
        """Make an empty layer of `size_bytes` at `path` over `parent`. A parent in the same
        directory is named by its file name alone, so that any directory that holds links to
        every layer of a chain opens it; any other (a template's disk) by its absolute path."""
        ...

    def rebase(self, path: Path, parent: Path) -> None:
        """Name `parent` as the parent of the layer (or template disk) at `path`, changing
        nothing else: the caller vouches that `parent` holds the same bytes as the parent
        `path` was made over (a copy of it on another host, ADR 0020). A parent ending in
        `suffix` is a layer, any other the raw rootfs; it is named as `create_layer` would."""
        ...

    def virtual_size(self, path: Path) -> int:
        """The size in bytes the guest sees of the disk whose top layer is `path`."""
        ...

    def layer_chain(self, top: Path) -> list[Path]:
        """The files the disk whose top layer is `top` reads: `top` first, the rootfs last."""
        ...

    async def start_flatten(self, vm: VMProcess, base: Path) -> None:
        """Start merging every disk layer between the running VM's top and `base` into the
        top, while the guest runs; the top then has `base` for its parent."""
        ...

    async def settle_flatten(self, vm: VMProcess, base: Path, wait_s: float) -> bool:
        """End a flatten: wait up to `wait_s` for it, else cancel it. True if the top's
        parent is `base` now (the layers between are merged and no longer used)."""
        ...


class VMMProcesses(Protocol):
    """Recognises a driver's VMM processes by their command lines alone, without a driver:
    garbage collection asks every known driver's, whichever ones this host's runtimes use."""

    def is_vmm(self, argv: Sequence[str]) -> bool:
        """Whether `argv` runs this driver's VMM (for any VM, pandastack's or not)."""
        ...

    def vm_workdir(self, argv: Sequence[str]) -> Path | None:
        """The work directory of the pandastack VM whose VMM `argv` runs; None for any other
        process."""
        ...


class VMMDriver(Protocol):
    """What the runtime needs from a hypervisor."""

    name: str
    accel: str
    # Volume slots of its VMs (a restore backs them, ADR 0027): part of its templates' key.
    volume_slots: int
    # What it can do beyond the calls every driver answers (see `Capability`).
    capabilities: frozenset[Capability]

    @property
    def disks(self) -> DiskLayers:
        """Its disk format: layers are made, read and merged through this."""
        ...

    @property
    def processes(self) -> VMMProcesses:
        ...

    def boot(self, paths: VMPaths, kernel: KernelSpec, disk: Path, memory_file: Path | None,
             shape: MachineShape, *, netns: str | None = None) -> VMProcess:
        """Cold-boot a VM whose RAM is `memory_file`, shared, so it can become a template; or,
        with None, private anonymous RAM (a stopped sandbox booting its own disk, whose later
        snapshots and hibernations then carry all of its memory). Sockets an earlier VMM
        left in `paths` are removed first."""
        ...

    async def save(self, vm: VMProcess, device_state: Path) -> None:
        """Stop a booted VM and write its device state; its RAM is already in its memory file."""
        ...

    async def restore(self, paths: VMPaths, snapshot: SnapshotFiles, disk: Path, *,
                      netns: str | None = None, hugetlb: bool = False,
                      volumes: Mapping[int, VolumeDrive] | None = None) -> VMProcess:
        """Start a VM from `snapshot`, mapping its memory privately; it runs when restored.
        `volumes` backs volume slots (the others stay empty).
        With `hugetlb` (only for a snapshot whose memory is all in its stream), the RAM is
        private 2 MiB pages from the host's hugetlb pool; HugePagesUnavailable if the pool
        has too few free. Sockets an earlier VMM left in `paths` are removed first."""
        ...

    async def pause(self, vm: VMProcess) -> None:
        """Stop the vCPUs in place."""
        ...

    async def resume(self, vm: VMProcess) -> None:
        """Start the vCPUs again."""
        ...

    async def snapshot_live(self, vm: VMProcess, stream: Path, new_top: Path, *,
                            short_pause: bool = False, overwrite: bool = False
                            ) -> SnapshotPause:
        """Write memory + device state to `stream` while the guest runs, moving its disk onto
        the empty layer `new_top` (over its current top) at the stop instant; report the
        guest's pause. The stream must always be one instant of the guest: a driver whose
        dirty-page tracking cannot be trusted either stops the guest for the whole save (the
        fastest save) or, with `short_pause` and where it can, write-protects guest memory
        instead (a slower save that stops the guest only to capture its device state).

        With `overwrite`, `stream` is an existing file (a warm buffer) written in place from
        its start and never truncated: bytes after the stream's end are left as they were,
        and a restore reads no further than the stream's own end."""
        ...

    async def save_stopped(self, vm: VMProcess, stream: Path) -> None:
        """Stop the guest and write its whole state, memory included, to `stream`."""
        ...

    async def resize_disk(self, vm: VMProcess, size_bytes: int) -> None:
        """Grow the running VM's root disk; the guest sees the new capacity at once."""
        ...

    async def announce_volumes(self, vm: VMProcess, sizes: Mapping[int, int]) -> None:
        """Tell the guest the capacity of the volumes a restore put in its slots (slot ->
        bytes): its kernel still holds the empty slot's size from the bake. Only once the
        VM runs (its restore complete)."""
        ...

    # -- live migration (ADR 0023): the agents hold the connection, the VMMs the stream --

    async def start_incoming(self, paths: VMPaths, kernel: KernelSpec, shape: MachineShape,
                             disk: Path, *, netns: str | None = None,
                             saved_by: str = "") -> VMProcess:
        """Start a VM that waits, stopped, for a migration stream; its disks stay inactive
        (not read) until `finish_incoming`, so its top layer may still be written then.
        `saved_by`: the sandbox's template's `SnapshotFiles.saved_by` (its machine)."""
        ...

    async def accept_incoming(self, vm: VMProcess, sock_fd: int) -> None:
        """Load the stream arriving on the connected socket `sock_fd` (the caller keeps and
        closes its own descriptor)."""
        ...

    async def wait_incoming(self, vm: VMProcess, timeout: float) -> None:
        """Until the whole stream is loaded (VMMError if it failed)."""
        ...

    async def finish_incoming(self, vm: VMProcess) -> None:
        """Activate the disks and run the migrated guest."""
        ...

    async def migrate_out(self, vm: VMProcess, sock_fd: int, *, converge_s: float,
                          timeout: float) -> MigrationStats:
        """Send the VM into the connected socket `sock_fd` while it runs (as far as this VMM
        tracks dirty memory correctly; past `converge_s` the guest is stopped); on return
        the guest is stopped, its disks flushed and no longer written. On a failure the
        guest runs again."""
        ...

    async def resume_source(self, vm: VMProcess) -> None:
        """After `migrate_out`, before any destination ran: the guest runs again here."""
        ...

    async def settle(self, vm: VMProcess, running: bool) -> None:
        """After the process that drove it died, bring a VM found running back to a steady
        state: an outgoing save or migration cancelled, its vCPUs running (`running`) or
        stopped. VMMError when it cannot be (it is still loading a restore)."""
        ...

    def owns(self, pid: int, paths: VMPaths) -> bool:
        """True if `pid` is this driver's VMM process for the VM in `paths` (for re-adoption;
        checked again right before, since a pid can be reused)."""
        ...

    def identity(self) -> str:
        """A string that changes whenever snapshots made by this driver become incompatible."""
        ...


def require(driver: VMMDriver, capability: Capability, operation: str) -> None:
    """CapabilityMissing unless `driver` declares `capability`: before `operation` starts."""
    if capability not in driver.capabilities:
        raise CapabilityMissing(driver.name, capability, operation)


#: How long a just-started VMM may take to create a socket it serves.
SOCKET_TIMEOUT_S = 30.0


async def connect_unix(path: Path, *, alive: Callable[[], bool],
                       timeout: float = SOCKET_TIMEOUT_S) -> socket.socket:
    """Connect to a unix socket that a just-started VMM is about to create."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            # Not loop.sock_connect: it takes a full backlog's EAGAIN for a connect in
            # progress and returns a socket that is not connected (agentlink/channel.py).
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError) as exc:
            sock.close()
            if not alive():
                raise VMMError(f"VMM exited early: {log_tail(path)}") from exc
            if loop.time() > deadline:
                raise VMMError(f"socket {path} did not appear") from exc
            await asyncio.sleep(0.001)


def log_tail(socket_path: Path) -> str:
    try:
        return (socket_path.parent / "vmm.log").read_text(errors="replace")[-500:]
    except OSError:
        return ""
