"""Warm hugetlb pages for the RAM of VMs restored from a stream (ADR 0011).

A VM restored from a stream (a fork's child, a sandbox made from a snapshot, a wake) has no
memory file to map: QEMU loads all of its RAM from the stream. On a host that is itself a VM
handing the memory it frees back to its hypervisor (virtio-balloon free page reporting, see
`vmm.host_memory.reports_free_pages`), most of that load is the outer hypervisor backing fresh pages
again. Touching 512 MiB took ~190 ms in 4 KiB pages and 0.85-1.2 s in fresh transparent huge
pages, but 22-33 ms in hugetlb pages that had been touched once before: the kernel keeps free
hugetlb pages in its own pool, off the free lists that the balloon reports, so they stay
backed from one VM to the next.

So a runtime adds its share of 2 MiB pages to the kernel's pool (`nr_hugepages`) when it first
restores from a stream, touches them once in the background at idle CPU priority, and takes
its share back at close. Until then, and whenever too little of the pool is free, a restore
uses anonymous memory. Each share is written down in a claim file (owner pid and start time)
under /run, so that a runtime that starts after a crash takes back the shares of owners that
died. VMs still holding pages when a share is taken back keep them: the kernel turns them into
surplus pages and frees them when those VMs end.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from pandastack.host.memory.idle_work import run_at_idle_priority, stop_idle_work

PAGE = 2 << 20
MIB = 1 << 20
POOL_SYSFS = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")
#: Every change of the pool's size on the host takes this lock, whichever directory holds the
#: claim: the size is read, then written, so two writers under different locks lose one's
#: pages to nobody's claim (test modules keep their claims apart and did: 4 GiB stayed in the
#: pool after a CI run).
POOL_LOCK = Path("/run/pandastack-hugetlb.lock")
#: The pool may hold at most 1/HOST_SHARE of the host's memory, all runtimes' shares together.
HOST_SHARE = 4
MAP_HUGETLB = 0x40000  # Linux, every architecture QEMU runs guests on here

# Touches each page once. Run as its own process: the pages go back to the pool when it exits.
WARM = f"""
import mmap, sys
size = int(sys.argv[1]) * {PAGE}
ram = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | {MAP_HUGETLB})
for offset in range(0, size, {PAGE}):
    ram[offset] = 1
"""


def host_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The host's memory (MemTotal) in MiB; 0 if it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def pages_for(memory_mb: int) -> int:
    """The 2 MiB pages a VM of `memory_mb` needs; 0 if its size is not a whole number of
    them (QEMU cannot back such RAM with them)."""
    size = memory_mb * MIB
    return size // PAGE if size % PAGE == 0 else 0


class HugePagePool:
    def __init__(self, claim: Path, pages: int = 0, *, sysfs: Path = POOL_SYSFS,
                 progress: Callable[[str], None] = print,
                 meminfo: Path = Path("/proc/meminfo"), lock: Path = POOL_LOCK) -> None:
        """`claim`: this runtime's claim file (its directory holds every runtime's claims);
        `pages`: the share to add, 0 for none."""
        self.claim = claim
        self.lock = lock
        self.pages = pages
        self.sysfs = sysfs
        self.meminfo = meminfo
        self.progress = progress
        self.state = "none"  # none -> warming -> ready; back to none at close
        self.granted = 0  # pages the kernel actually added for this runtime
        self._held: dict[str, int] = {}  # pages leased, by the VM (its directory) they are for
        self.served = 0  # VMs started on pool pages (benchmarks report which restores were)
        self._warming: asyncio.Task[None] | None = None
        self._adding: asyncio.Future[int] | None = None

    # -- leases -----------------------------------------------------------------------------

    def lease(self, owner: str, memory_mb: int) -> bool:
        """Whether the VM `owner` (of `memory_mb`), about to start, may take its RAM from the
        pool; if so, the pages are counted as its own until `release(owner)`. The first call
        starts adding this runtime's share.

        A runtime counts only its own share, and only by its own leases: the kernel's
        counters show a VM's pages only once QEMU has mapped them, which is after the next
        VM of the same fork may already have asked. The kernel is asked too, for pages other
        processes hold; one may still take them before QEMU maps its RAM, and QEMU then
        fails to start (`HugePagesUnavailable`): the caller falls back to anonymous memory."""
        if self.pages <= 0:
            return False
        if self.state == "none":
            self.state = "warming"
            self._warming = asyncio.get_running_loop().create_task(self._fill(),
                                                                   name="huge-page-pool")
        need = pages_for(memory_mb)
        if (self.state != "ready" or need == 0 or owner in self._held
                or self.granted - sum(self._held.values()) < need or self.available() < need):
            return False
        self._held[owner] = need
        return True

    def release(self, owner: str) -> None:
        """The VM `owner` ended, or will not use the pool: its pages are free again."""
        self._held.pop(owner, None)

    def available(self) -> int:
        """Pool pages neither in use nor reserved by a mapping, whoever added them."""
        try:
            return self._read("free_hugepages") - self._read("resv_hugepages")
        except (OSError, ValueError):
            return 0

    # -- this runtime's share -----------------------------------------------------------------

    async def _fill(self) -> None:
        try:
            # A thread cannot be cancelled: `close` waits for this one before taking back.
            self._adding = asyncio.ensure_future(asyncio.to_thread(self._add_share))
            self.granted = await asyncio.shield(self._adding)
            if self.granted < self.pages:
                self.progress(f"huge page pool: the kernel gave {self.granted} of "
                              f"{self.pages} pages")
            count = min(self.granted, self.available())
            if count > 0:
                await run_at_idle_priority([sys.executable, "-c", WARM, str(count)],
                                           f"touching {count} pages")
        except Exception as exc:  # restores still work on anonymous memory: say so, go on
            self.progress(f"huge page pool: {exc}")
        self.state = "ready"

    def _add_share(self) -> int:
        with self._locked():
            before = persistent_pages(self.sysfs)
            owner = {"pid": os.getpid(), "start": _start_time(os.getpid())}
            # Claimed before the pool grows: growing it by a few GiB can take seconds, and a
            # process killed in that write (a server SIGKILLed in its first fork) left pages
            # in the pool that no claim named, for good (14 GiB of them after a chaos run
            # here). A claim whose owner died before it was settled is taken back in full:
            # too few pages then (restores fall back to anonymous memory) is better than
            # pages nobody gives back.
            # Every runtime on the host adds a share (test sessions run many): together they
            # never hold more than HOST_SHARE of its memory, whatever each one asks.
            ceiling = host_memory_mb(self.meminfo) * MIB // PAGE // HOST_SHARE
            pages = min(self.pages, max(0, ceiling - before))
            if pages <= 0:
                return 0
            _write_json(self.claim, {**owner, "pages": pages, "pending": True})
            self._write_pool(before + pages)
            granted = max(0, persistent_pages(self.sysfs) - before)
            if granted:
                _write_json(self.claim, {**owner, "pages": granted})
            else:
                self.claim.unlink(missing_ok=True)
            return granted

    def _take_back(self, claim: Path) -> None:
        """(Under the lock.) Remove `claim`'s pages from the pool, then the claim."""
        pages = claimed_pages(claim)
        if pages > 0:
            self._write_pool(max(0, persistent_pages(self.sysfs) - pages))
        claim.unlink(missing_ok=True)

    def sweep(self) -> None:
        """At start: take back the shares of runtimes (this one's predecessor included) whose
        process is gone."""
        if not self.claim.parent.is_dir():
            return
        with self._locked():
            for claim in sorted(self.claim.parent.glob("*.claim")):
                try:
                    owner = json.loads(claim.read_text())
                    alive = _start_time(int(owner["pid"])) == owner["start"]
                except (OSError, ValueError, KeyError, TypeError):
                    alive = False
                if not alive or claim == self.claim:
                    self._take_back(claim)

    async def close(self) -> None:
        """Stop touching pages and take this runtime's share back."""
        await stop_idle_work(self._warming)
        self._warming = None
        if self._adding is not None:
            await asyncio.wait([self._adding])
            self._adding = None
        if self.claim.exists():
            await asyncio.to_thread(self.take_back_claim)
        self.state = "none"
        self.granted = 0
        self._held.clear()

    def take_back_claim(self) -> None:
        """Take back the share this pool's claim file names, whoever made it (`close`; and a
        claim directory about to be removed, whose shares no sweep would find again)."""
        with self._locked():
            self._take_back(self.claim)

    # -- files ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Runtimes on one host change the pool's size one at a time (POOL_LOCK)."""
        self.claim.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with open(fd, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _read(self, name: str) -> int:
        return int((self.sysfs / name).read_text())

    def _write_pool(self, pages: int) -> None:
        # The kernel may grant fewer pages than asked when memory is short or fragmented.
        (self.sysfs / "nr_hugepages").write_text(f"{pages}\n")


def persistent_pages(sysfs: Path = POOL_SYSFS) -> int:
    """The pool's persistent pages: what a write of `nr_hugepages` sets. Reading it back
    counts surplus pages too (those a share taken back left in use: a dead runtime's VMs),
    and a write of that count made them persistent: the pages of VMs that were about to end
    stayed in the pool for good (a chaos run's SIGKILLed forks left 2048). Surplus is read on
    both sides of the total, so a page freed in between is not counted twice."""

    def surplus() -> int:
        try:
            return int((sysfs / "surplus_hugepages").read_text())
        except FileNotFoundError:  # a stand-in pool with no surplus file
            return 0

    for _ in range(100):
        before = surplus()
        total = int((sysfs / "nr_hugepages").read_text())
        if surplus() == before:
            return max(0, total - before)
    return max(0, int((sysfs / "nr_hugepages").read_text()) - surplus())


def claimed_pages(claim: Path) -> int:
    """The pages a claim file names (0 if it cannot be read: gone, or not a claim)."""
    try:
        return int(json.loads(claim.read_text())["pages"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, it names one
    process (a pid alone may have been reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
