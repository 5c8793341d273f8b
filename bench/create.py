"""Create latency and idle cost of sandboxes, against the raw floor measured in the same run.

Create latency: N sequential creates from `base`, each timed from the call to the end of its
first successful exec (`true`). The floor: the same snapshot restored by bare QEMU (same
command line, overlay written the same way) plus one trivial exec sent through a raw socket
with hand-made frames: no runtime bookkeeping, no init message, no client library.

Idle cost: K sandboxes left idle; CPU share from /proc/PID/stat over a window, and PSS /
private memory from /proc/PID/smaps_rollup.

With --init-cost R, the floor is also timed with a `ping`, and with an `init`, sent in its
one write between hello and exec: what `init` costs the guest, without a round trip.

Usage: python bench/create.py [--n 30] [--idle 20] [--idle-window 20] [--init-cost R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from common import pct
from pandastack.guestproto import frames as protocol
from pandastack.host.agentlink.handshake import InitParams
from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.templates.builtin import Template
from pandastack.host.vmm.driver import VMPaths
from pandastack.host.vmm.qemu.qcow2 import create_overlay
from pandastack.hostport.network import NetworkPolicy

CLK_TCK = os.sysconf("SC_CLK_TCK")


async def floor_once(rt: HostRuntime, tmpl: Template, workdir: Path,
                     extra: bytes = b"", argv: list[str] | None = None) -> float:
    # The VM needs a namespace with its tap; it is made before the clock starts (the product
    # takes a prepared one from its spares), so the floor is the restore and the exec alone.
    workdir.mkdir(parents=True)
    slot = rt.network.claim(workdir)
    await asyncio.to_thread(rt.network.setup, slot, NetworkPolicy())
    started = time.perf_counter()
    disk = workdir / "disk.qcow2"
    create_overlay(disk, tmpl.disk, tmpl.disk_bytes)
    paths = VMPaths(workdir)
    vm = await rt.driver.restore(paths, tmpl.snapshot, disk, netns=slot.netns)
    try:
        sock = vm.agent_connection  # the driver connects before the guest resumes
        assert sock is not None
        sock.setblocking(True)
        sock.sendall(protocol.frame("hello", 0, v=1, nonce="floor") + extra
                     + protocol.frame("exec", 1, argv=argv or ["true"]))
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        decoder = protocol.FrameDecoder()
        synced = False
        while True:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 30)
            if not data:
                raise RuntimeError("agent closed the channel")
            decoder.feed(data)
            if not synced:
                hello = decoder.scan(lambda f: f.t == "hello")
                if hello is None:
                    continue
                synced = True
            while (frame := decoder.next_frame()) is not None:
                if frame.id == 2 and frame.t == "error":
                    raise RuntimeError(f"floor's extra request failed: {frame.header}")
                if frame.id == 1 and frame.t == "exit":
                    elapsed = time.perf_counter() - started
                    sock.close()
                    return elapsed
                if frame.t == "error":
                    raise RuntimeError(f"floor exec failed: {frame.header}")
    finally:
        vm.kill()
        rt.network.teardown(slot)
        rt.network.release(slot)
        shutil.rmtree(workdir, ignore_errors=True)


async def product_once(rt: HostRuntime) -> tuple[float, float]:
    started = time.perf_counter()
    sbx = await rt.create("base")
    created = time.perf_counter()
    result = await sbx.exec(["true"])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result
    await rt.kill(sbx.id)
    return elapsed, created - started


def proc_cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def proc_memory_kib(pid: int) -> tuple[int, int]:
    pss = private = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key == "Pss":
                pss = int(rest.split()[0])
            elif key in ("Private_Clean", "Private_Dirty"):
                private += int(rest.split()[0])
    return pss, private


async def network_setup_cost(rt: HostRuntime, state: Path, count: int) -> list[float]:
    times = []
    for i in range(count):
        owner = state / f"net-{i}"
        owner.mkdir()
        started = time.perf_counter()
        slot = rt.network.claim(owner)
        await asyncio.to_thread(rt.network.setup, slot, NetworkPolicy())
        times.append((time.perf_counter() - started) * 1000)
        await asyncio.to_thread(rt.network.teardown, slot)
        rt.network.release(slot)
        owner.rmdir()
    return times


def init_frame() -> bytes:
    """The `init` a create sends: a fresh clock, 64 bytes of entropy, hostname, machine-id."""
    return InitParams(time.time_ns(), os.urandom(64), f"sbx-{os.urandom(6).hex()}",
                      uuid.uuid4().hex).frame(2)


async def init_cost(rt: HostRuntime, tmpl: Template, state: Path,
                    rounds: int) -> dict[str, list[float]]:
    """What `init` adds to the floor's guest work, with no extra round trip: the floor as is,
    with a `ping` between its hello and its exec (the cost of one more request), and with an
    `init` there (the request and what it does). Interleaved, so drift hits all three."""
    variants = {"floor": lambda: b"", "+ ping": lambda: protocol.frame("ping", 2),
                "+ init": init_frame}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(rounds):
        for k, (name, extra) in enumerate(variants.items()):
            workdir = state / f"init-cost-{i}-{k}"
            times[name].append(await floor_once(rt, tmpl, workdir, extra()) * 1000)
    return times


async def idle_cost(rt: HostRuntime, count: int, window: float) -> dict[str, float]:
    sandboxes = [await rt.create("base") for _ in range(count)]
    for sbx in sandboxes:  # every sandbox did some real work once
        await sbx.exec(["true"])
    await asyncio.sleep(5)
    pids = [s.pid for s in sandboxes if s.pid is not None]
    before = {pid: proc_cpu_ticks(pid) for pid in pids}
    t0 = time.monotonic()
    await asyncio.sleep(window)
    wall = time.monotonic() - t0
    cpu = [(proc_cpu_ticks(pid) - before[pid]) / CLK_TCK / wall * 100 for pid in pids]
    mem = [proc_memory_kib(pid) for pid in pids]
    for sbx in sandboxes:
        await rt.kill(sbx.id)
    return {
        "cpu_pct_mean": statistics.mean(cpu),
        "cpu_pct_max": max(cpu),
        "pss_mib_mean": statistics.mean(m[0] for m in mem) / 1024,
        "private_mib_mean": statistics.mean(m[1] for m in mem) / 1024,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--idle-window", type=float, default=20.0)
    parser.add_argument("--init-cost", type=int, default=0, metavar="ROUNDS",
                        help="also time the floor with a ping, and with an init, in its one "
                             "write (ROUNDS of each, interleaved)")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="psb-", dir="/tmp"))
    rt = HostRuntime(HostConfig.from_env(state_dir=state), progress=lambda m: print(m))
    try:
        await rt.start()
        tmpl = await rt.ensure_template("base")
        driver = rt.driver
        print(f"accelerator: {driver.accel}; template {tmpl.key}")
        # Warm the host page cache for the template files once, for both sides alike.
        await floor_once(rt, tmpl, state / "warm")
        await product_once(rt)
        floor: list[float] = []
        product: list[float] = []
        ready: list[float] = []
        for i in range(args.n):  # interleaved so that drift hits both alike
            floor.append(await floor_once(rt, tmpl, state / f"floor-{i}"))
            total, create_only = await product_once(rt)
            product.append(total)
            ready.append(create_only)
        f50, f99 = pct(floor, 50) * 1000, pct(floor, 99) * 1000
        p50, p99 = pct(product, 50) * 1000, pct(product, 99) * 1000
        r50 = pct(ready, 50) * 1000
        print(f"floor   (bare restore + exec): p50 {f50:7.1f} ms  p99 {f99:7.1f} ms")
        print(f"product (create + first exec): p50 {p50:7.1f} ms  p99 {p99:7.1f} ms")
        print(f"product create() alone:        p50 {r50:7.1f} ms")
        print(f"ratio p50/floor-p50 {p50 / f50:.2f}   p99/floor-p50 {p99 / f50:.2f}")
        net = await network_setup_cost(rt, state, 10)
        print(f"network slot built from scratch (what a create pays without a prepared spare): "
              f"p50 {pct(net, 50):.1f} ms  p99 {pct(net, 99):.1f} ms")
        if args.init_cost:
            costs = await init_cost(rt, tmpl, state, args.init_cost)
            base = pct(costs["floor"], 50)
            for name, values in costs.items():
                print(f"{name:8s} p50 {pct(values, 50):7.1f} ms  "
                      f"({pct(values, 50) - base:+5.1f} ms over the floor)")
        if args.idle:
            idle = await idle_cost(rt, args.idle, args.idle_window)
            print(f"idle x{args.idle}: cpu mean {idle['cpu_pct_mean']:.2f}% of a core "
                  f"(max {idle['cpu_pct_max']:.2f}%), PSS mean {idle['pss_mib_mean']:.1f} MiB, "
                  f"private mean {idle['private_mib_mean']:.1f} MiB")
    finally:
        await rt.kill_all()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
