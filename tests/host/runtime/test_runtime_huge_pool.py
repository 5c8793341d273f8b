"""VMs restored from a stream take their RAM from the huge page pool (ADR 0011), on real VMs:
forks, snapshot restores and wakes; anonymous memory when the pool is short or was taken by
another process; the pool's share back out of the kernel's pool at the end."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.memory.huge_pool import PAGE, POOL_SYSFS
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from tests.helpers import close_private_runtime
from tests.leftovers import owned_tmpdir

# Reads and grows the kernel's hugetlb pool, which is host-wide: the serial lane.
pytestmark = [pytest.mark.vm, pytest.mark.serial]

# Holds all free pool pages but argv[1] (as another program on the host could: the pool is
# the kernel's, shared by every runtime), says how many it holds, and keeps them until EOF.
GRAB = f"""
import mmap, sys
free = int(open("{POOL_SYSFS}/free_hugepages").read())
free -= int(open("{POOL_SYSFS}/resv_hugepages").read())
held = max(0, free - int(sys.argv[1]))
if held:
    ram = mmap.mmap(-1, held * {PAGE}, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)
    for offset in range(0, held * {PAGE}, {PAGE}):
        ram[offset] = 1
print(held, flush=True)
sys.stdin.read()
"""


def _grab(leave: int) -> subprocess.Popen[str]:
    grabber = subprocess.Popen([sys.executable, "-c", GRAB, str(leave)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert grabber.stdout is not None
    assert int(grabber.stdout.readline()) >= 0
    return grabber


def _release(grabber: subprocess.Popen[str] | None) -> None:
    if grabber is not None:
        grabber.kill()
        grabber.wait()


def _pool_pages() -> int:
    return int((POOL_SYSFS / "nr_hugepages").read_text())


def _hugetlb_kib(sbx: SandboxHandle) -> int:
    """The huge pages the sandbox's VMM process maps (its RAM, if on the pool)."""
    assert sbx.pid is not None
    for status_line in Path(f"/proc/{sbx.pid}/status").read_text().splitlines():
        if status_line.startswith("HugetlbPages:"):
            return int(status_line.split()[1])
    raise AssertionError("no HugetlbPages line")


async def _same_machine(sbx: SandboxHandle) -> None:
    assert (await sbx.exec("cat /work/mark")).stdout == b"parent"
    assert (await sbx.exec("pgrep -x sleep")).exit_code == 0


async def test_stream_restores_take_ram_from_the_pool_and_do_without_it(
        host_config: HostConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    if not POOL_SYSFS.is_dir():
        pytest.skip("no 2 MiB hugetlb pages on this kernel")
    state = owned_tmpdir("pshp-")
    snaps = owned_tmpdir("pshp-snap-")
    # Room for two 512 MiB sandboxes, whatever "auto" would say on this host.
    config = HostConfig(home=host_config.home, state_dir=state, snapshots_root=snaps,
                        stream_hugetlb_mb=1024)
    before = _pool_pages()
    rt = HostRuntime(config, progress=lambda m: None)
    await rt.start()
    grabber: subprocess.Popen[str] | None = None
    try:
        parent = await rt.create()  # from the template: RAM is its memory file, not the pool
        await parent.write_file("/work/mark", b"parent")
        await parent.spawn(["sleep", "600"])
        assert rt.huge_pool.state == "none"

        # The first restore from a stream starts the pool; it runs on anonymous memory.
        (first,) = await rt.fork(parent.id)
        assert rt.huge_pool.served == 0 and _hugetlb_kib(first) == 0
        await rt.kill(first.id)
        deadline = time.monotonic() + 120
        while rt.huge_pool.state != "ready":
            assert time.monotonic() < deadline, "the pool never became ready"
            await parent.exec("true")  # lets the pool's task run
        assert _pool_pages() == before + 512
        assert config.hugetlb_claim.exists()

        # With two children's worth of pages free, the third gets anonymous memory.
        grabber = _grab(leave=512)
        kids = await rt.fork(parent.id, count=3)
        assert rt.huge_pool.served == 2
        on_pool = sorted(_hugetlb_kib(kid) for kid in kids)
        assert on_pool == [0, 512 << 10, 512 << 10]
        for kid in kids:
            await _same_machine(kid)
        # A pool child's own stream restores like any other (here on anonymous memory: the
        # pool has no room left).
        pooled = next(kid for kid in kids if _hugetlb_kib(kid))
        (grandchild,) = await rt.fork(pooled.id)
        assert rt.huge_pool.served == 2
        await _same_machine(grandchild)
        for kid in (*kids, grandchild):
            await rt.kill(kid.id)
        _release(grabber)
        grabber = None

        # A wake is a restore from a stream too.
        await rt.hibernate(parent.id)
        await rt.wake(parent.id)
        assert rt.huge_pool.served == 3 and _hugetlb_kib(parent) == 512 << 10
        await _same_machine(parent)

        # Another process takes every free page after the runtime has counted them: QEMU
        # cannot map its RAM there, and the restore goes on with anonymous memory.
        grabber = _grab(leave=0)
        monkeypatch.setattr(rt.huge_pool, "available", lambda: 1 << 20)
        snap = await rt.snapshot(parent.id)
        child = await rt.create(snapshot=snap.info.id)
        assert rt.huge_pool.served == 3 and _hugetlb_kib(child) == 0
        await _same_machine(child)
        rt.delete_snapshot(snap.info.id)
    finally:
        _release(grabber)
        leftovers = await close_private_runtime(rt, state, snaps)
    assert _pool_pages() == before, "the runtime's pages outlived it"
    assert not config.hugetlb_claim.exists()
    assert leftovers == ([], [])
