"""The binary guest agent (ADR 0038, the default since ADR 0039) against the Python one, side
by side in one run: issue 23's benchmark figures.

Two runtimes in this process, each on private temporary state (bench/common.py's
temp_runtime), each with its own template: one whose image has the reference Python agent
(`PANDASTACK_GUEST_AGENT=python` while its template is ensured), one with the binary. Then N
rounds; in each round every part runs once per agent, the agents' order flipped every round,
so that drift hits both alike. The parts (`--only`, comma-separated; the floor always runs):
- floor: the agent's own template restored by bare QEMU, hello + exec `true` in one write,
  to that exec's exit (bench/create.py's floor: no runtime, no init, no client library);
  every other part's ratio to the floor is to this, of the same agent, same run;
- create: `create("base")` -> first exec (`true`) through the runtime (create.py's product);
- fork: a running sandbox runs `true`, then `fork(count=1)` -> the child's first exec,
  timed from the fork call (bench/fork.py's "fork(count=1) to child's 1st exec"); one
  untimed fork first lets the runtime prepare its fork buffer and huge page pool, as in
  fork.py. `--dirty-mb M` gives the parent M MB of dirty memory (fork.py's make_dirty);
- wake: a sandbox is hibernated (timed too, reported apart), then its first exec wakes it:
  timed from that exec's call to its result (fork.py's "wake (to first exec)");
- api (also `--api`): one `pandastack serve` per agent (bench/api.py's live_server, its
  environment carrying the agent's choice), `Sandbox.create(template="base")` + first exec
  through the SDK with its own client (api.py's api_once); shown against the agent's own
  floor and against the Python agent's floor (issue 23: the API path at or below 1.0 x the
  bare floor of today's agent; the "minimal Python agent" of the issue is not in bench/:
  the Python floor here is the real reference agent).
With --idle K: K idle sandboxes of each, CPU share over a window and PSS per VM
(create.py's idle_cost).

Forked and woken RAM: no huge page pool for either runtime unless --hugetlb-mb gives each a
share (the pool is the host's: on a shared host the first runtime may get every page).

Usage: python bench/agent_binary.py [--n 15] [--only create,fork,wake,api] [--api]
       [--dirty-mb 0] [--hugetlb-mb 0] [--idle 0] [--idle-window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from api import Server, api_once, kill_everything, live_server
from common import pct, settle_fork_machinery, temp_runtime
from create import floor_once, idle_cost, product_once
from fork import make_dirty
from pandastack.host.images.build import GUEST_AGENT_ENV
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.templates.builtin import Template

AGENTS = ("python", "binary")
PARTS = ("create", "fork", "wake", "api")
TARGET = 0.80  # issue 23: at least 20 % lower than with the Python agent

METRICS = {"create": ("create",), "fork": ("fork", "forked"), "wake": ("wake", "hibernate"),
           "api": ("api",)}  # what each part times, in the order printed
LABELS = {
    "floor": "floor (bare restore -> exec)",
    "create": "create -> first exec",
    "fork": "fork -> child's first exec",
    "forked": "  fork() until it returns",
    "hibernate": "  hibernate",
    "wake": "wake -> first exec",
    "api": "API Sandbox.create -> 1st exec",
}


@dataclass
class Side:
    """One agent's runtime, template, long-lived sandboxes and timings (ms, by metric)."""

    agent: str
    rt: HostRuntime
    tmpl: Template
    scratch: Path
    parent: SandboxHandle | None = None
    sleeper: SandboxHandle | None = None
    server: Server | None = None
    times: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metric: str, seconds: float) -> None:
        self.times.setdefault(metric, []).append(seconds * 1000)


def line(name: str, values: list[float]) -> str:
    return (f"{name:<42} p50 {pct(values, 50):7.1f}  p90 {pct(values, 90):7.1f}  "
            f"p99 {pct(values, 99):7.1f} ms (n={len(values)})")


async def fork_once(side: Side) -> None:
    assert side.parent is not None
    assert (await side.parent.exec(["true"])).exit_code == 0  # it has just run a command
    started = time.perf_counter()
    (kid,) = await side.rt.fork(side.parent.id, count=1)
    returned = time.perf_counter()
    try:
        result = await kid.exec(["true"])
        done = time.perf_counter()
        assert result.exit_code == 0, result
    finally:
        await side.rt.kill(kid.id)
    side.add("forked", returned - started)
    side.add("fork", done - started)


async def wake_once(side: Side) -> None:
    assert side.sleeper is not None
    started = time.perf_counter()
    await side.rt.hibernate(side.sleeper.id)
    hibernated = time.perf_counter()
    result = await side.sleeper.exec(["true"])  # wakes it
    done = time.perf_counter()
    assert result.exit_code == 0, result
    side.add("hibernate", hibernated - started)
    side.add("wake", done - hibernated)


async def api_round(side: Side) -> None:
    assert side.server is not None
    # In a thread: the SDK blocks, and the runtimes of this process keep their background
    # work (spare network slots) going meanwhile, as they would between two creates.
    _, total = await asyncio.to_thread(api_once, side.server, ["true"])
    side.add("api", total)


async def run_part(side: Side, part: str, i: int) -> None:
    if part == "floor":
        side.add("floor", await floor_once(side.rt, side.tmpl, side.scratch / f"floor-{i}"))
    elif part == "create":
        side.add("create", (await product_once(side.rt))[0])
    elif part == "fork":
        await fork_once(side)
    elif part == "wake":
        await wake_once(side)
    elif part == "api":
        await api_round(side)


async def prepare(side: Side, parts: list[str], dirty_mb: int,
                  stack: contextlib.AsyncExitStack) -> None:
    """Everything a timed round must not pay for: page cache, fork machinery, servers."""
    rt = side.rt
    await floor_once(rt, side.tmpl, side.scratch / "warm")
    await product_once(rt)
    if "fork" in parts:
        side.parent = await make_dirty(rt, dirty_mb) if dirty_mb else await rt.create()
        await side.parent.exec(["true"])
        (kid,) = await rt.fork(side.parent.id, count=1)
        await kid.exec(["true"])
        await rt.kill(kid.id)
        await settle_fork_machinery(rt)
    if "wake" in parts:
        side.sleeper = await rt.create()
        await side.sleeper.exec(["true"])
        await wake_once(side)  # the first hibernation of the run, untimed
        side.times.clear()
    if "api" in parts:
        os.environ[GUEST_AGENT_ENV] = side.agent  # the server's environment is a copy
        (side.scratch / "server").mkdir(parents=True)
        side.server = stack.enter_context(live_server(side.scratch / "server"))
        stack.callback(kill_everything, side.server)
        print(f"{side.agent}: server up at {side.server.api_url}")
        await api_round(side)  # the server may load or bake its template first
        side.times.clear()


def report(sides: dict[str, Side], args: argparse.Namespace, parts: list[str]) -> None:
    print(f"\n{args.n} rounds, interleaved, agents' order flipped each round"
          + (f"; fork parent with {args.dirty_mb} MB dirty memory" if args.dirty_mb else ""))
    print("floor = the agent's own template restored by bare QEMU, hello + exec `true` in one "
          "write, to its exit (create.py's floor: no runtime, no init, no client)")
    metrics = ["floor", *(m for p in parts for m in METRICS[p])]
    for metric in metrics:
        print()
        for agent in AGENTS:
            print(line(f"{agent}: {LABELS[metric]}", sides[agent].times[metric]))
        p50 = {a: pct(sides[a].times[metric], 50) for a in AGENTS}
        floor = {a: pct(sides[a].times["floor"], 50) for a in AGENTS}
        ratio = f"binary / python p50 {p50['binary'] / p50['python']:.2f}"
        if metric in ("create", "fork", "wake"):
            ratio += f" (issue 23: <= {TARGET:.2f})"
        print(ratio)
        if metric != "floor":
            print("p50 / own floor p50: " + ", ".join(
                f"{a} {p50[a] / floor[a]:.2f}" for a in AGENTS))
        if metric == "api":
            print("p50 / the Python agent's floor p50 (issue 23: <= 1.00): " + ", ".join(
                f"{a} {p50[a] / floor['python']:.2f}" for a in AGENTS))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=15, help="rounds (each part once per agent)")
    parser.add_argument("--only", default="create,fork,wake", metavar="PARTS",
                        help=f"comma-separated parts out of {','.join(PARTS)} (the floor "
                             "always runs); default create,fork,wake")
    parser.add_argument("--api", action="store_true",
                        help="add the api part: one `pandastack serve` per agent")
    parser.add_argument("--dirty-mb", type=int, default=0,
                        help="dirty memory of the fork parent (fork.py's make_dirty)")
    parser.add_argument("--hugetlb-mb", type=int, default=0,
                        help="each runtime's huge page pool share (HostConfig.stream_hugetlb_mb) "
                             "for forked and woken RAM; default 0: none for either, since on a "
                             "shared host the first runtime can get the pages, the second none")
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--idle-window", type=float, default=20.0)
    args = parser.parse_args()
    parts = [p for p in args.only.split(",") if p]
    if args.api and "api" not in parts:
        parts.append("api")
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown part(s) {','.join(unknown)}: choose from {','.join(PARTS)}")
    if not 1 <= args.n <= 1000:
        parser.error("--n must be between 1 and 1000")
    parts = [p for p in PARTS if p in parts]
    before = os.environ.get(GUEST_AGENT_ENV)
    sides: dict[str, Side] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for agent in AGENTS:
                # Read when the image is gathered, which the runtime's start already does.
                os.environ[GUEST_AGENT_ENV] = agent
                rt, scratch = await stack.enter_async_context(
                    temp_runtime(f"psb-agent-{agent}-", stream_hugetlb_mb=args.hugetlb_mb))
                tmpl = await rt.ensure_template("base")
                print(f"{agent}: template {tmpl.key}")
                sides[agent] = Side(agent, rt, tmpl, scratch)
            for side in sides.values():
                await prepare(side, parts, args.dirty_mb, stack)
            for i in range(args.n):
                order = AGENTS if i % 2 == 0 else AGENTS[::-1]
                for part in ("floor", *parts):
                    for agent in order:
                        await run_part(sides[agent], part, i)
            report(sides, args, parts)
            if args.hugetlb_mb:
                for side in sides.values():
                    print(f"{side.agent}: huge page pool granted {side.rt.huge_pool.granted} "
                          f"pages, {side.rt.huge_pool.served} VMs started on them")
            if args.idle:
                for side in sides.values():
                    for handle in (side.parent, side.sleeper):
                        if handle is not None:  # only the idle ones count
                            await side.rt.kill(handle.id)
                    cost = await idle_cost(side.rt, args.idle, args.idle_window)
                    print(f"{side.agent}: idle x{args.idle}: cpu mean {cost['cpu_pct_mean']:.2f} "
                          f"% max {cost['cpu_pct_max']:.2f} %, PSS {cost['pss_mib_mean']:.1f} "
                          f"MiB, private {cost['private_mib_mean']:.1f} MiB")
    finally:
        if before is None:
            os.environ.pop(GUEST_AGENT_ENV, None)
        else:
            os.environ[GUEST_AGENT_ENV] = before


if __name__ == "__main__":
    asyncio.run(main())
