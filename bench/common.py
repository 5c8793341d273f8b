"""What every benchmark script shares: percentiles, the result line, a host runtime on
private, temporary state and snapshot directories that are removed afterwards, and the stop
of a server or agent subprocess that kills any VM it left."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.vmm.driver import read_cmdline


def pct(values: list[float], q: float) -> float:
    """The q-th percentile by nearest rank (no interpolation: a reported value was measured)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def line(label: str, values: list[float], unit: str = "ms", width: int = 40) -> str:
    digits = 2 if unit == "s" else 1
    return (f"{label:{width}s} p50 {pct(values, 50):8.{digits}f} {unit}  "
            f"p99 {pct(values, 99):8.{digits}f} {unit}  (n={len(values)})")


@asynccontextmanager
async def temp_runtime(prefix: str, **config: object) -> AsyncIterator[tuple[HostRuntime, Path]]:
    """A started runtime whose sandboxes and snapshots live in temporary directories; on exit
    every sandbox is killed, every snapshot deleted and the directories removed. Yields the
    runtime and a scratch directory beside them. `config` overrides HostConfig fields."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    rt = HostRuntime(HostConfig.from_env(state_dir=root / "sandboxes",
                                         snapshots_root=root / "snapshots",
                                         volumes_root=root / "volumes", **config),
                     progress=print)
    try:
        await rt.start()
        yield rt, root / "scratch"
    finally:
        await rt.kill_all()
        for info in rt.snapshots.all(include_internal=True):
            rt.delete_snapshot(info.id)
        await rt.close()
        shutil.rmtree(root, ignore_errors=True)


def qemu_pids_under(directory: Path) -> list[int]:
    """Live QEMU processes whose command line mentions `directory`."""
    prefix = str(directory)
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            argv = read_cmdline(int(proc.name))
            if argv and "qemu" in argv[0] and any(prefix in a for a in argv):
                pids.append(int(proc.name))
    return pids


def stop(proc: subprocess.Popen[bytes], tmp: Path) -> None:
    """SIGTERM (SIGKILL after 30 s), then kill any VM left under `tmp`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in qemu_pids_under(tmp):
        os.kill(pid, signal.SIGKILL)


async def settle_fork_machinery(rt: HostRuntime, timeout: float = 120.0) -> None:
    """Wait for the fork buffer and huge page pool that a runtime's first fork starts
    preparing (as a server does after its first fork), so no timed fork pays for them."""
    deadline = time.monotonic() + timeout
    while "warming" in (rt.huge_pool.state, rt.fork_buffer.state):
        if time.monotonic() > deadline:
            raise RuntimeError("the fork buffer or huge page pool is still warming")
        await asyncio.sleep(0.2)
