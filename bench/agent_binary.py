"""The binary guest agent (ADR 0038) against the Python one, side by side in one run.

Two runtimes in this process, each with its own state: one whose images have the Python agent
(the default), one whose images have the binary (`PANDASTACK_GUEST_AGENT=binary` while its
template is ensured). Then, interleaved so that drift hits both alike, N rounds of:
- create → first exec (`true`) through the runtime (bench/create.py's product path);
- the floor: the same template restored by bare QEMU, hello + exec in one write (create.py's
  floor), i.e. restore → first answer of the agent with nothing of the runtime around it.
With --idle K: K idle sandboxes of each, CPU share over a window and PSS per VM.

Usage: python bench/agent_binary.py [--n 15] [--idle 0] [--idle-window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from common import pct
from create import floor_once, idle_cost, product_once
from pandastack.host.config import HostConfig
from pandastack.host.images.build import GUEST_AGENT_ENV
from pandastack.host.runtime import HostRuntime
from pandastack.host.templates.builtin import Template

AGENTS = ("python", "binary")


async def start(agent: str, state: Path) -> tuple[HostRuntime, Template]:
    os.environ[GUEST_AGENT_ENV] = agent  # read when the image is gathered
    rt = HostRuntime(HostConfig.from_env(state_dir=state), progress=lambda m: print(m))
    await rt.start()
    tmpl = await rt.ensure_template("base")
    print(f"{agent}: template {tmpl.key}")
    return rt, tmpl


def line(name: str, values: list[float]) -> str:
    return (f"{name:<34} p50 {pct(values, 50):7.1f}  p90 {pct(values, 90):7.1f}  "
            f"p99 {pct(values, 99):7.1f} ms (n={len(values)})")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--idle-window", type=float, default=20.0)
    args = parser.parse_args()
    before = os.environ.get(GUEST_AGENT_ENV)
    base = Path(tempfile.mkdtemp(prefix="psb-agent-", dir="/tmp"))
    runtimes: dict[str, tuple[HostRuntime, Template]] = {}
    try:
        for agent in AGENTS:
            runtimes[agent] = await start(agent, base / agent)
        create: dict[str, list[float]] = {a: [] for a in AGENTS}
        floor: dict[str, list[float]] = {a: [] for a in AGENTS}
        for agent, (rt, tmpl) in runtimes.items():  # warm the page cache alike
            await floor_once(rt, tmpl, base / f"warm-{agent}")
            await product_once(rt)
        for i in range(args.n):
            for agent, (rt, tmpl) in runtimes.items():
                elapsed, _ = await product_once(rt)
                create[agent].append(elapsed * 1000)
                floor[agent].append(await floor_once(rt, tmpl, base / f"floor-{agent}-{i}") * 1000)
        for agent in AGENTS:
            print(line(f"{agent}: create -> first exec", create[agent]))
            print(line(f"{agent}: floor (restore -> exec)", floor[agent]))
        p50 = {a: pct(create[a], 50) for a in AGENTS}
        print(f"create -> first exec p50, binary / python: {p50['binary'] / p50['python']:.2f}")
        for agent, (rt, _) in runtimes.items():
            if args.idle:
                cost = await idle_cost(rt, args.idle, args.idle_window)
                print(f"{agent}: idle x{args.idle}: cpu mean {cost['cpu_pct_mean']:.2f} % "
                      f"max {cost['cpu_pct_max']:.2f} %, PSS {cost['pss_mib_mean']:.1f} MiB, "
                      f"private {cost['private_mib_mean']:.1f} MiB")
    finally:
        for rt, _ in runtimes.values():
            await rt.kill_all()
        shutil.rmtree(base, ignore_errors=True)
        if before is None:
            os.environ.pop(GUEST_AGENT_ENV, None)
        else:
            os.environ[GUEST_AGENT_ENV] = before


if __name__ == "__main__":
    asyncio.run(main())
