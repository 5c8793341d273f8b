"""Helpers shared by tests (kept out of conftest so test modules can import them)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import signal
import time
import zipfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pandastack.host import config as host_config
from pandastack.host.memory.huge_pool import HugePagePool
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import iter_cmdlines
from pandastack.host.vmm.factory import is_vmm_process
from tests.leftovers import owned_tmpdir

# A guest process that holds a random value only in its memory, writes it to /tmp/value once
# and to /tmp/told on SIGUSR1: what a fork, a transfer or a move must carry over is this
# process, alive, with that value (run it with `python3 -c HOLDER`).
HOLDER = ("import os, signal, time\n"
          "v = os.urandom(8).hex()\n"
          "signal.signal(signal.SIGUSR1, lambda *a: open('/tmp/told', 'w').write(v))\n"
          "open('/tmp/value', 'w').write(v)\n"
          "while True: time.sleep(1)\n")

SandboxFactory = Callable[..., Awaitable[SandboxHandle]]


async def start_holder(sbx: SandboxHandle) -> tuple[int, str]:
    """HOLDER started in `sbx` (a runtime's handle): its pid and the value it holds."""
    pid = await sbx.spawn(["python3", "-c", HOLDER])
    for _ in range(100):
        got = (await sbx.exec(["cat", "/tmp/value"])).stdout
        if len(got) == 16:
            return pid, got.decode()
        await asyncio.sleep(0.1)
    raise AssertionError("the holder did not start")


async def holder_value(sbx: SandboxHandle, pid: int) -> str:
    """What the holder `pid` says it holds now (SIGUSR1, then /tmp/told)."""
    script = (f"rm -f /tmp/told; kill -USR1 {pid} || exit 3; "
              "for i in $(seq 50); do [ -s /tmp/told ] && exec cat /tmp/told; sleep 0.1; "
              "done; exit 4")
    result = await sbx.exec(["sh", "-c", script])
    assert result.exit_code == 0, result
    return result.stdout.decode()


def vmm_pids_under(directory: Path) -> list[int]:
    """Live VMM processes (of any known driver) whose command line mentions `directory`."""
    prefix = str(directory)
    return [pid for pid, argv in iter_cmdlines()
            if is_vmm_process(argv) and any(prefix in a for a in argv)]


qemu_pids_under = vmm_pids_under  # the name the server and e2e tests import


@contextmanager
def private_vmm_root(prefix: str) -> Iterator[Path]:
    """A directory for a module's runtimes (home, state) with the host-wide claim directories
    (fork buffers, hugetlb claims) moved into it; at the end, any VMM left under it is killed,
    the directory removed, and the test fails naming the leaked VMMs."""
    path = owned_tmpdir(prefix)  # short: socket paths
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(host_config, "FORK_BUFFERS_ROOT", path / "fork-buffers")
        patch.setattr(host_config, "HUGETLB_CLAIMS_ROOT", path / "hugetlb")
        yield path
    leftovers = vmm_pids_under(path)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    # A share of the host's hugetlb pool whose claim is removed with the directory would stay
    # in the pool for good: taken back first.
    shares = sorted((path / "hugetlb").glob("*.claim"))
    for claim in shares:
        HugePagePool(claim, progress=lambda _m: None).take_back_claim()
    shutil.rmtree(path, ignore_errors=True)
    assert not leftovers, f"VMMs leaked: {leftovers}"
    assert not shares, f"hugetlb pool shares left by runtimes not closed: {shares}"


async def assert_clock_on_time(sbx: SandboxHandle, slack: float = 0.5, why: str = "") -> None:
    """The guest's wall clock, read by an exec, is within `slack` s of the host's time during
    that exec: between the host's clock before the call and after it. (Not the call's
    midpoint: a slow round trip on a loaded host would count as a clock off by half of it.)"""
    before = time.time()
    result = await sbx.exec(["date", "+%s.%N"], timeout=60)
    after = time.time()
    assert result.exit_code == 0, result
    guest = float(result.stdout)
    assert before - slack <= guest <= after + slack, \
        f"{why}: guest clock {guest - before:+.3f} s from the call's start, " \
        f"{guest - after:+.3f} s from its end (slack {slack} s)"


def remove_private_dirs(state: Path, snaps: Path) -> tuple[list[str], list[str]]:
    """Remove a test runtime's private state and snapshot directories, also when the test
    failed; return what was left in them (VMM processes under `state` are killed first and
    listed as "pid N")."""
    pids = vmm_pids_under(state)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    left = ([f"pid {pid}" for pid in pids] + sorted(p.name for p in state.iterdir()),
            sorted(p.name for p in snaps.iterdir()))
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(snaps, ignore_errors=True)
    return left


async def close_private_runtime(rt: HostRuntime, state: Path,
                                snaps: Path) -> tuple[list[str], list[str]]:
    """Kill a test's own runtime's sandboxes, delete its snapshots and close it, then
    `remove_private_dirs` (also when one of those steps fails); return what was left."""
    try:
        await rt.kill_all()
        for info in rt.snapshots.all(include_internal=True):
            rt.delete_snapshot(info.id)
        await rt.close()
    finally:
        left = remove_private_dirs(state, snaps)
    return left


def make_wheel(directory: Path, name: str, version: str, source: str) -> Path:
    """A minimal pure-Python wheel holding module `name` with `source` (a zip of the
    module, METADATA, WHEEL and RECORD): template builds install it with no package index."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel
