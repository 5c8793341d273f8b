"""Admission by the host's real memory (ADR 0050): a VM starts only if the machine can take it.

Placement counts each sandbox's declared `memory_mb` against what a host offers, but guests
are overcommitted (a 512 MiB clone costs ~40 MiB of host memory while idle), so nothing there
stops the kernel's OOM killer, which may pick the API server or the agent. Here, before a VMM
starts, `MemAvailable` is read from /proc/meminfo (one small read, whatever the number of
sandboxes); what VMs admitted but still starting will take is subtracted (their memory is
not in that reading yet, so N concurrent creates cannot all pass on the same one); and the
start is refused when what is left would fall under the reserve.

A reservation is held until its VM is up (agent answered, or the migration's stream loaded):
from then on what its VM took shows in MemAvailable and is counted there instead. Under TCG
the part a VM takes only on its first command (the code it translates then) stays reserved
until that command has run, or the VM ended: creates made in a burst, then all used, would
otherwise be admitted on a reading that their first execs take ~16 MiB each below. What a
guest takes beyond that (touching more of its RAM) is not admitted: each VM's cgroup
`memory.max` bounds it, and the reserve is what absorbs it between two creates.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType

from pandastack.host.config import HostConfig
from pandastack.hostport.errors import HostMemoryExhausted

MIB = 1 << 20
# The reserve when PANDASTACK_MEMORY_RESERVE_MB is unset: 5 % of MemTotal, at least 1 GiB. It
# must hold what running guests take after their admission until the next create reads
# MemAvailable again (a clone's translated code grows ~10 MiB on its first exec; a guest may
# touch far more), plus the page cache the host itself needs to stay responsive (the API
# server, the agent, QEMU's binaries and the template files clones map). 1 GiB is ~25 clones'
# idle memory; on a large host a fixed 1 GiB is too little margin for thousands of guests.
RESERVE_FLOOR_MB = 1024
RESERVE_SHARE_PERCENT = 5

# What one VMM takes of the host at start, beyond the guest RAM it loads (derived from the
# per-mapping measurement of idle clones in docs/benchmarks.md "PSS per idle sandbox": QEMU's
# heap 5.2, other anonymous 3.0, a malloc arena 2.2, relocated libraries and binary 4.6,
# stacks 0.6, the guest's first private pages 1.6 MiB, and the pages the first VMs map that
# others share), rounded so that a template clone under TCG (this + TCG_START_MB) is the
# 40 MiB of host memory per idle sandbox that bench/density.py measured (39.6 MiB, K=100).
VMM_FIXED_MB = 24
# The translation buffer a restore and its first exec fill under TCG (3.8 MiB after the
# restore, 13.1-14.6 MiB after one exec: docs/benchmarks.md); never more than tb-size. Most
# of it comes with the first command: held until then (`first_command`). Measured with
# bench/density.py (2026-12-05, K=168): 18 MiB of host memory per sandbox once up, 34.5 MiB
# after one `echo ok` each.
TCG_START_MB = 16

MemInfo = Callable[[], tuple[int, int] | None]


def meminfo_kib(path: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in KiB, as the kernel states them; None where they cannot be
    read."""
    total = available = None
    try:
        with path.open(encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "MemTotal":
                    total = int(rest.split()[0])
                elif name == "MemAvailable":
                    available = int(rest.split()[0])
                    break  # it comes after MemTotal and MemFree
    except (OSError, ValueError, IndexError):
        return None
    if total is None or available is None:
        return None
    return total, available


def read_meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in MiB; None where it cannot be read (then nothing is
    refused: no reading, no verdict)."""
    reading = meminfo_kib(path)
    return None if reading is None else (reading[0] // 1024, reading[1] // 1024)


def file_bytes(path: Path) -> int:
    """The size of a stream to load; 0 where it is missing (the restore then fails itself)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def default_reserve_mb(total_mb: int) -> int:
    return max(RESERVE_FLOOR_MB, total_mb * RESERVE_SHARE_PERCENT // 100)


def vm_start_mb(*, tcg: bool, tb_size_mb: int, loaded_bytes: int = 0) -> int:
    """The host memory a VM's start takes: the VMM itself, its translated code under TCG,
    and the guest RAM it loads into its own (anonymous) memory: a snapshot's or a
    hibernation's stream, a migration's whole RAM, a cold boot's RAM. A clone of a template
    maps the template's memory file and loads nothing (`loaded_bytes` 0)."""
    tcg_mb = min(tb_size_mb, TCG_START_MB) if tcg else 0
    return VMM_FIXED_MB + tcg_mb + -(-loaded_bytes // MIB)


@dataclass(frozen=True)
class MemoryStatus:
    """What admission sees now (MiB)."""

    total_mb: int
    available_mb: int
    held_mb: int  # reserved by VM starts under way and first commands still to come
    starting: int  # VM starts under way
    reserve_mb: int

    @property
    def room_mb(self) -> int:
        """What a VM start may still take."""
        return self.available_mb - self.held_mb - self.reserve_mb


class Reservation:
    """Memory set aside for one VM start. `up(owner)` once the VM is up keeps only what its
    first command takes, under `owner` (its directory: `MemoryAdmission.first_command` or
    `ended` drops it); `release()` gives back all (its start failed). As a context manager
    it releases on an exit that did not call `up`."""

    def __init__(self, admission: MemoryAdmission, key: int, mb: int, later_mb: int) -> None:
        self._admission = admission
        self._key = key
        self.mb = mb
        self.later_mb = later_mb  # of `mb`: what its first command takes
        self._owner: str | None = None

    def up(self, owner: str) -> Callable[[], None]:
        """What to call once its first command ran (`SandboxHandle.on_first_command`)."""
        self._owner = owner
        self._admission._up(self._key, owner, self.later_mb)
        return partial(self._admission.first_command, owner)

    def release(self) -> None:
        self._admission._release(self._key)
        if self._owner is not None:
            self._admission.ended(self._owner)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None or self._owner is None:
            self.release()


class MemoryAdmission:
    """One per runtime. `reserve_mb` None: `default_reserve_mb` of this host's MemTotal."""

    def __init__(self, reserve_mb: int | None = None, *, tb_size_mb: int = 64,
                 meminfo: MemInfo = read_meminfo) -> None:
        if reserve_mb is not None and reserve_mb < 0:
            raise ValueError(f"the memory reserve must be 0 or more MiB, not {reserve_mb}")
        self._reserve_setting = reserve_mb
        self.tb_size_mb = tb_size_mb
        self._meminfo = meminfo
        # A thread lock, not an asyncio one: the read and the reservation must be one step
        # for callers on the event loop and in worker threads alike; it is held for one
        # small file read.
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # VM starts under way
        self._later: dict[str, int] = {}  # first commands to come, by VM directory
        self._held_mb = 0  # both together
        self._keys = itertools.count()

    @classmethod
    def for_host(cls, config: HostConfig) -> MemoryAdmission:
        return cls(config.memory_reserve_mb, tb_size_mb=config.tb_size_mb)

    def _reserve_for(self, total_mb: int) -> int:
        if self._reserve_setting is not None:
            return self._reserve_setting
        return default_reserve_mb(total_mb)

    def status(self) -> MemoryStatus | None:
        reading = self._meminfo()
        if reading is None:
            return None
        total, available = reading
        with self._lock:
            return MemoryStatus(total, available, self._held_mb, len(self._held),
                                self._reserve_for(total))

    def reserve(self, need_mb: int, what: str, *, later_mb: int = 0) -> Reservation:
        """Set `need_mb` aside for the start of `what` (a sandbox id, and how it starts), of
        which `later_mb` stays held from `up` to its first command; or raise
        HostMemoryExhausted (a HostExhausted: the control plane tries another host, and
        answers 503 when none takes it)."""
        with self._lock:
            reading = self._meminfo()
            if reading is not None:
                total, available = reading
                reserve = self._reserve_for(total)
                if available - self._held_mb - need_mb < reserve:
                    raise HostMemoryExhausted(
                        what=what, available_mb=available, reserve_mb=reserve,
                        need_mb=need_mb, held_mb=self._held_mb, starting=len(self._held),
                        waiting=len(self._later))
            key = next(self._keys)
            self._held[key] = need_mb
            self._held_mb += need_mb
            return Reservation(self, key, need_mb, min(later_mb, need_mb))

    def vm_start(self, what: str, accel: str, loaded_bytes: int = 0) -> Reservation:
        """`reserve` what a VM's start takes (`vm_start_mb`) under `accel` ("tcg", "kvm"),
        of which its translated code is taken only with its first command."""
        tcg = accel == "tcg"
        return self.reserve(vm_start_mb(tcg=tcg, tb_size_mb=self.tb_size_mb,
                                        loaded_bytes=loaded_bytes), what,
                            later_mb=min(self.tb_size_mb, TCG_START_MB) if tcg else 0)

    def first_command(self, owner: str) -> None:
        """The VM of `owner` ran its first command: what that took is in MemAvailable now."""
        self.ended(owner)

    def ended(self, owner: str) -> None:
        """The VM of `owner` is gone (or ran its first command)."""
        with self._lock:
            self._held_mb -= self._later.pop(owner, 0)

    def _up(self, key: int, owner: str, later_mb: int) -> None:
        with self._lock:
            self._held_mb -= self._held.pop(key, 0)
            self._held_mb -= self._later.pop(owner, 0)
            if later_mb:
                self._later[owner] = later_mb
                self._held_mb += later_mb

    def _release(self, key: int) -> None:
        with self._lock:
            self._held_mb -= self._held.pop(key, 0)

    @property
    def held_mb(self) -> int:
        return self._held_mb
