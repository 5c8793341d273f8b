"""The huge page pool on its own, against the kernel's real hugetlb pool: a share is added on
first use, touched, leased, taken back at close, and taken back by a later runtime when its
owner died. No VM needed (root to resize the pool)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.host.memory.huge_pool import (
    POOL_LOCK,
    POOL_SYSFS,
    HugePagePool,
    _start_time,
    host_memory_mb,
    pages_for,
)

# Serial: these read and grow the host-wide hugetlb pool, which the other lane's runtimes
# take their shares of (a share is capped across all runtimes, so one beside them was
# granted 0 pages: CI run of 2026-12-03 23:32).
pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]


def _pool(name: str = "nr_hugepages") -> int:
    return int((POOL_SYSFS / name).read_text())


async def _ready(pool: HugePagePool) -> None:
    for _ in range(1200):
        if pool.state == "ready":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the pool never became ready")


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[HugePagePool]:
    if os.geteuid() != 0 or not POOL_SYSFS.is_dir():
        pytest.skip("resizing the hugetlb pool needs root and 2 MiB pages")
    made = HugePagePool(tmp_path / "claims" / "me.claim", pages=4, progress=lambda m: None)
    yield made
    await made.close()


def test_host_memory_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemFree:        21529000 kB\n")
    assert host_memory_mb(meminfo) == 24105
    assert host_memory_mb(tmp_path / "missing") == 0


def test_pages_for_whole_huge_pages_only() -> None:
    assert pages_for(512) == 256
    assert pages_for(2) == 1
    assert pages_for(129) == 0  # QEMU cannot back 129 MiB with 2 MiB pages


async def test_share_is_added_on_first_lease_and_taken_back_at_close(
        pool: HugePagePool) -> None:
    before = _pool()
    # The first lease only starts adding the share: that VM uses anonymous memory.
    assert not pool.lease("vm-0", 4)
    assert pool.state == "warming"
    await _ready(pool)
    assert pool.granted == 4
    assert _pool() == before + 4
    claim = json.loads(pool.claim.read_text())
    assert claim["pid"] == os.getpid() and claim["pages"] == 4

    # Leases count against this runtime's own share, whatever else the pool has free.
    assert pool.lease("vm-1", 4)
    assert not pool.lease("vm-1", 4)  # one lease per VM
    assert not pool.lease("vm-2", 3)  # not a whole number of 2 MiB pages
    assert not pool.lease("vm-2", 6)  # 3 pages: 2 are left
    assert pool.lease("vm-2", 4)
    assert not pool.lease("vm-3", 2)
    pool.release("vm-1")
    assert pool.lease("vm-3", 2)
    assert pool.lease("vm-4", 2)
    assert not pool.lease("vm-5", 2)

    await pool.close()
    assert _pool() == before
    assert not pool.claim.exists()
    assert pool.state == "none"


async def test_no_share_no_pool(tmp_path: Path) -> None:
    off = HugePagePool(tmp_path / "me.claim", pages=0)
    assert not off.lease("vm", 512)
    assert off.state == "none"
    await off.close()


async def test_a_dead_owners_share_is_taken_back_at_start(pool: HugePagePool) -> None:
    before = _pool()
    # A runtime that died: its pages are in the pool and its claim names a process gone.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (POOL_SYSFS / "nr_hugepages").write_text(f"{before + 3}\n")
    assert _pool() == before + 3
    pool.claim.parent.mkdir(parents=True)
    orphan = pool.claim.parent / "dead.claim"
    orphan.write_text(json.dumps({"pid": int(dead.stdout), "start": "1", "pages": 3}))
    # A live owner's claim (this process) stays.
    alive = pool.claim.parent / "alive.claim"
    alive.write_text(json.dumps({"pid": os.getpid(), "start": _start_time(os.getpid()),
                                 "pages": 0}))

    pool.sweep()
    assert _pool() == before
    assert not orphan.exists()
    assert alive.exists()


async def test_close_while_the_share_is_being_added_takes_it_back(pool: HugePagePool) -> None:
    before = _pool()
    assert not pool.lease("vm", 4)  # starts adding the share in a thread
    await asyncio.sleep(0)  # the task starts that thread
    await pool.close()  # at once: the thread has not written the claim yet
    await asyncio.sleep(1)  # a thread left running would have added its pages by now
    assert _pool() == before
    assert not pool.claim.exists()


def test_a_share_whose_owner_died_while_growing_the_pool_is_taken_back(tmp_path: Path) -> None:
    """On a stand-in sysfs: the owner is killed in the middle of growing the pool (after the
    write, before anything else). A later runtime's sweep must take the pages back; they were
    claimed by nobody before, and stayed in the pool for good."""
    sysfs = tmp_path / "sysfs"
    sysfs.mkdir()
    (sysfs / "nr_hugepages").write_text("7\n")  # another runtime's, or the operator's
    claims = tmp_path / "claims"

    class Killed(BaseException):
        pass

    class DiesInTheWrite(HugePagePool):
        def _write_pool(self, pages: int) -> None:
            super()._write_pool(pages)
            raise Killed

    dying = DiesInTheWrite(claims / "a.claim", pages=10, sysfs=sysfs, progress=lambda m: None,
                           meminfo=_meminfo(tmp_path, 1 << 20))
    with pytest.raises(Killed):
        dying._add_share()
    assert int((sysfs / "nr_hugepages").read_text()) == 17
    claim = json.loads((claims / "a.claim").read_text())
    claim["pid"] = 2**22 + 1  # its owner is gone
    (claims / "a.claim").write_text(json.dumps(claim))
    HugePagePool(claims / "b.claim", pages=4, sysfs=sysfs, progress=lambda m: None).sweep()
    assert int((sysfs / "nr_hugepages").read_text()) == 7
    assert not (claims / "a.claim").exists()


def _meminfo(tmp_path: Path, mib: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {mib * 1024} kB\n")
    return path


def test_all_shares_together_stay_under_a_quarter_of_the_host(tmp_path: Path) -> None:
    """Many runtimes on one host (a test session's servers and agents) each added up to an
    eighth of its memory; together they could take all of it."""
    sysfs = tmp_path / "sysfs"
    sysfs.mkdir()
    (sysfs / "nr_hugepages").write_text("0\n")
    meminfo = _meminfo(tmp_path, 4096)  # a quarter: 1024 MiB, 512 pages
    granted = [HugePagePool(tmp_path / "claims" / f"{n}.claim", pages=200, sysfs=sysfs,
                            progress=lambda m: None, meminfo=meminfo)._add_share()
               for n in range(4)]
    assert granted == [200, 200, 112, 0]
    assert int((sysfs / "nr_hugepages").read_text()) == 512



def _resize_cycles(pool: HugePagePool, cycles: int) -> None:
    for _ in range(cycles):
        assert pool._add_share() == 2
        pool.take_back_claim()


def test_pools_whose_claims_live_apart_resize_one_at_a_time(tmp_path: Path) -> None:
    """The pool's size is read, then written: two runtimes whose claims are in different
    directories (test modules keep theirs apart) must still take one lock, or one's pages end
    up in nobody's claim (4 GiB stayed in the pool after a CI run, when the lock was the
    claim directory's). Both resize at once, many times: nothing may be left."""
    assert HugePagePool(tmp_path / "x.claim").lock == HugePagePool(
        tmp_path / "y" / "z.claim").lock == POOL_LOCK
    sysfs = tmp_path / "sysfs"
    sysfs.mkdir()
    (sysfs / "nr_hugepages").write_text("0\n")
    meminfo = _meminfo(tmp_path, 1 << 20)
    pools = [HugePagePool(tmp_path / f"claims{n}" / "a.claim", pages=2, sysfs=sysfs,
                          progress=lambda m: None, meminfo=meminfo, lock=tmp_path / "pool.lock")
             for n in range(2)]
    workers = [threading.Thread(target=_resize_cycles, args=(pool, 300)) for pool in pools]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert int((sysfs / "nr_hugepages").read_text()) == 0


# Maps and touches argv[1] pool pages, says so, and keeps them until EOF: a VM of a runtime
# that died, whose share was taken back under it.
HOLD = f"""
import mmap, sys
size = int(sys.argv[1]) * {2 << 20}
ram = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)
for offset in range(0, size, {2 << 20}):
    ram[offset] = 1
print("held", flush=True)
sys.stdin.read()
"""


async def test_a_share_added_beside_surplus_pages_leaves_nothing_once_they_go(
        pool: HugePagePool) -> None:
    """A dead runtime's share taken back while its VMs still hold pages turns them into
    surplus pages, which the kernel frees when those VMs end. The pool's size read back counts
    them; a share added on that count made them persistent, and the pages stayed in the pool
    when the VMs ended (a chaos run: 2048 pages, 4 GiB, no claim)."""
    before = _pool()
    if _pool("surplus_hugepages"):
        pytest.skip("the host's pool has surplus pages already")
    try:
        (POOL_SYSFS / "nr_hugepages").write_text(f"{before + 2}\n")  # the dead one's share
        holder = subprocess.Popen([sys.executable, "-c", HOLD, "2"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            # Taken back under its VM: the pool shrinks below the pages in use.
            persistent = _pool() - _pool("free_hugepages") - 2
            (POOL_SYSFS / "nr_hugepages").write_text(f"{persistent}\n")
            assert _pool("surplus_hugepages") == 2 and _pool() == persistent + 2
            assert not pool.lease("vm", 4)  # this runtime adds its share meanwhile
            await _ready(pool)
            assert pool.granted == 4
            await pool.close()
        finally:
            holder.kill()
            holder.wait()
        assert (_pool(), _pool("surplus_hugepages")) == (persistent, 0)
    finally:
        (POOL_SYSFS / "nr_hugepages").write_text(f"{before}\n")
