"""Fork, snapshot and hibernation latency for a parent with ~200 MB of dirty guest memory.

For each of N rounds: a user snapshot of the parent (the short-pause kind: timed, with the
guest pause reported by the VMM), the snapshot that a fork takes (fastest save, its stream in
the warm fork buffer when there is one: timed, with its pause), then one child restored from
that to its first exec (timed), then `fork(count=1)` end to end (timed). Before the rounds,
one fork (its time is printed) has the runtime prepare its fork buffer and huge page pool,
as a server's first fork does; pauses are also shown for the rounds whose stream went into
the buffer, and the count of children restored onto pool pages. Then a few `fork(count=3)`
(timed until they return), and hibernate and wake (to the first exec) of a sandbox with the
same dirty memory. The floor, measured in the same run: a create from the template plus its
first exec (no memory to carry over).

With `--sdk`, the same parent is made through a real `pandastack serve` (loopback, private
state) and the Python SDK instead (issue 36, target 4): `sbx.fork(count=3)` until it returns
(its children's agents have answered), the time per child (total / 3), each child's first
exec after that; `fork(count=1)` until it returns and its child's first exec, against a
create (`client.sandboxes.create`) and its first exec in the same rounds, interleaved; and the
parent's pause window as the API reports it (`parent_pause_ms` of the fork's answer). A few
untimed forks come first (the server's first fork prepares its fork buffer and page pool).

Usage: python bench/fork.py [--n 8] [--dirty-mb 200] [--sdk]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from common import line as _line
from common import pct, settle_fork_machinery
from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle

# The parent's memory to carry over, the same for the in-process and the SDK rounds (fork_sdk).
DIRTY = """
import sys, time
blob = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(blob), 4096):
    blob[i] = (i >> 12) & 0xFF or 1
open('/work/dirty.ready', 'w').write('ok')
while True:
    time.sleep(3600)
"""


line = partial(_line, width=34)


async def make_dirty(rt: HostRuntime, mb: int) -> SandboxHandle:
    sbx = await rt.create()
    await sbx.write_file("/work/dirty.py", DIRTY.encode())
    await sbx.spawn(["python3", "/work/dirty.py", str(mb)])
    deadline = time.monotonic() + 300
    while (await sbx.exec("test -e /work/dirty.ready")).exit_code != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the dirtying process did not finish")
        await asyncio.sleep(0.5)
    return sbx


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--dirty-mb", type=int, default=200)
    parser.add_argument("--sdk", action="store_true",
                        help="through pandastack serve and the Python SDK")
    args = parser.parse_args()
    if args.sdk:
        from fork_sdk import sdk_main
        await asyncio.to_thread(sdk_main, args.n, args.dirty_mb)
        return
    state = Path(tempfile.mkdtemp(prefix="psbf-", dir="/tmp"))
    snaps = Path(tempfile.mkdtemp(prefix="psbf-snap-", dir="/tmp"))
    rt = HostRuntime(HostConfig.from_env(state_dir=state, snapshots_root=snaps),
                     progress=print)
    floor: list[float] = []
    snap_ms: list[float] = []
    pause_ms: list[float] = []
    buffered_pause_ms: list[float] = []
    bg_snap_ms: list[float] = []
    bg_pause_ms: list[float] = []
    child_ms: list[float] = []
    fork_ms: list[float] = []
    forked_ms: list[float] = []  # until fork() returns: the child's agent has answered
    fork_pause_ms: list[float] = []  # the parent's pause fork() reports
    stream_mb: list[float] = []
    pooled_children = 0
    try:
        await rt.start()
        await rt.ensure_template()
        parent = await make_dirty(rt, args.dirty_mb)
        print(f"parent {parent.id} holds {args.dirty_mb} MB of dirty memory")
        # The runtime's first fork finds no fork buffer and no huge page pool: it starts
        # preparing both (as a server does after its first fork), then the rounds begin.
        t0 = time.perf_counter()
        (kid,) = await rt.fork(parent.id, count=1)
        await kid.exec(["true"])
        print(f"first fork after start, to child's 1st exec: "
              f"{(time.perf_counter() - t0) * 1000:.1f} ms")
        await rt.kill(kid.id)
        await settle_fork_machinery(rt)
        print(f"huge page pool: {rt.huge_pool.granted} pages of 2 MiB")
        for _ in range(args.n):
            t0 = time.perf_counter()
            plain = await rt.create()
            await plain.exec(["true"])
            floor.append((time.perf_counter() - t0) * 1000)
            await rt.kill(plain.id)

            t0 = time.perf_counter()
            snap = await rt.snapshot(parent.id)  # a user's snapshot: the short pause
            bg_snap_ms.append((time.perf_counter() - t0) * 1000)
            bg_pause_ms.append(snap.pause_ms)
            rt.delete_snapshot(snap.info.id)

            t0 = time.perf_counter()
            snap = await rt.snapshot(parent.id, internal=True, transient=True,
                                     short_pause=False)  # what a fork takes
            snap_ms.append((time.perf_counter() - t0) * 1000)
            pause_ms.append(snap.pause_ms)
            if rt.fork_buffer.holds(rt.snapshots.stream(snap.info.id)):
                buffered_pause_ms.append(snap.pause_ms)
            stream_mb.append(snap.info.state_bytes / 2**20)
            served = rt.huge_pool.served
            t0 = time.perf_counter()
            child = await rt.create(snapshot=snap.info.id)
            await child.exec(["true"])
            child_ms.append((time.perf_counter() - t0) * 1000)
            pooled_children += rt.huge_pool.served - served
            await rt.kill(child.id)
            rt.delete_snapshot(snap.info.id)

            served = rt.huge_pool.served
            t0 = time.perf_counter()
            kids = await rt.fork(parent.id, count=1)
            forked_ms.append((time.perf_counter() - t0) * 1000)
            (kid,) = kids
            if kids.parent_pause_ms is not None:
                fork_pause_ms.append(kids.parent_pause_ms)
            await kid.exec(["true"])
            fork_ms.append((time.perf_counter() - t0) * 1000)
            pooled_children += rt.huge_pool.served - served
            await rt.kill(kid.id)

        # Several children at once: they load their streams side by side.
        trio_ms: list[float] = []
        pooled_trios = 0
        for _ in range(max(2, args.n // 2)):
            served = rt.huge_pool.served
            t0 = time.perf_counter()
            kids = await rt.fork(parent.id, count=3)
            trio_ms.append((time.perf_counter() - t0) * 1000)
            pooled_trios += rt.huge_pool.served - served
            for kid in kids:
                await rt.kill(kid.id)

        hib_ms: list[float] = []
        wake_ms: list[float] = []
        pooled_wakes = 0
        for _ in range(max(2, args.n // 2)):
            t0 = time.perf_counter()
            await rt.hibernate(parent.id)
            hib_ms.append((time.perf_counter() - t0) * 1000)
            served = rt.huge_pool.served
            t0 = time.perf_counter()
            await parent.exec(["true"])  # wakes it
            wake_ms.append((time.perf_counter() - t0) * 1000)
            pooled_wakes += rt.huge_pool.served - served

        print(line("floor: create + first exec", floor))
        print(line("snapshot(), short pause", bg_snap_ms))
        print(line("  its parent pause window", bg_pause_ms))
        print(line("snapshot, fastest save (fork's)", snap_ms))
        print(line("  its parent pause window", pause_ms))
        if buffered_pause_ms:
            print(line("  the same, stream in the buffer", buffered_pause_ms))
        print(line("child from snapshot, to 1st exec", child_ms))
        print(line("fork(count=1), until it returns", forked_ms))
        print(line("fork(count=1) to child's 1st exec", fork_ms))
        if fork_pause_ms:
            print(line("  parent pause it reports", fork_pause_ms))
        print(line("fork(count=3), until it returns", trio_ms))
        print(line("hibernate", hib_ms))
        print(line("wake (to first exec)", wake_ms))
        print(f"state stream per snapshot: {statistics.mean(stream_mb):.0f} MiB")
        print(f"RAM on huge page pool pages: {pooled_children} of {2 * args.n} children, "
              f"{pooled_trios} of {3 * len(trio_ms)} in threes, "
              f"{pooled_wakes} of {len(wake_ms)} wakes")
        print(f"ratio child p50 / floor p50: {pct(child_ms, 50) / pct(floor, 50):.2f}; "
              f"fork p50 / floor p50: {pct(fork_ms, 50) / pct(floor, 50):.2f}")
    finally:
        await rt.kill_all()
        for info in rt.snapshots.all(include_internal=True):
            rt.delete_snapshot(info.id)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(snaps, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
