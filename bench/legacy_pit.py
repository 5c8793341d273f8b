"""The i8254 timer (PIT) in a TCG VM against none, in one run (ADR 0040).

Two runtimes in this process on private temporary state (common.temp_runtime), the first's
QEMU driver with `legacy_pit=True` (the machine every VM had before ADR 0040), the second's
with the default (no PIT under TCG); each bakes its own `base` template, since the machine
is part of the template's key. Then N rounds, the sides' order flipped each round:
- floor: that side's template restored by bare QEMU, hello + exec `true` (create.py's floor);
- create: `create("base")` -> first exec (`true`) through the runtime (create.py's product).
Then K idle sandboxes of each side (create.idle_cost: CPU share over a window, PSS), and
the wakeups of one idle VM's QEMU: voluntary context switches a second over all its
threads, read from /proc (each is one sleep of a thread that something then woke).

Usage: python bench/legacy_pit.py [--n 15] [--idle 10] [--idle-window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path

from common import line, pct, temp_runtime
from create import floor_once, idle_cost, product_once
from pandastack.host.runtime import HostRuntime
from pandastack.host.templates.builtin import Template
from pandastack.host.vmm.qemu import QemuDriver

SIDES = ("with PIT", "without PIT")
WAKEUP_WINDOW = 10.0


def voluntary_switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for row in (task / "status").read_text().splitlines():
                if row.startswith("voluntary_ctxt_switches:"):
                    total += int(row.split()[1])
    return total


async def wakeups_per_second(rt: HostRuntime) -> float:
    sbx = await rt.create("base")
    try:
        await sbx.exec(["true"])
        await asyncio.sleep(5)
        assert sbx.pid is not None
        before, started = voluntary_switches(sbx.pid), time.monotonic()
        await asyncio.sleep(WAKEUP_WINDOW)
        return (voluntary_switches(sbx.pid) - before) / (time.monotonic() - started)
    finally:
        await rt.kill(sbx.id)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument("--idle", type=int, default=10)
    parser.add_argument("--idle-window", type=float, default=20.0)
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        sides: dict[str, tuple[HostRuntime, Path, Template]] = {}
        for side in SIDES:
            rt, scratch = await stack.enter_async_context(temp_runtime("bench-pit-"))
            driver = rt.driver
            assert isinstance(driver, QemuDriver) and driver.accel == "tcg", "a TCG QEMU bench"
            driver.legacy_pit = side == "with PIT"
            tmpl = await rt.ensure_template("base")
            print(f"{side}: -M {driver.machine()}")
            await floor_once(rt, tmpl, scratch / "warm")  # page cache, spare slots
            await product_once(rt)
            sides[side] = (rt, scratch, tmpl)
        for i in range(args.n):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                rt, scratch, tmpl = sides[side]
                times.setdefault((side, "floor"), []).append(
                    await floor_once(rt, tmpl, scratch / f"floor-{i}") * 1000)
                times.setdefault((side, "create"), []).append((await product_once(rt))[0] * 1000)
        print(f"\n{args.n} rounds, interleaved, sides' order flipped each round")
        for metric, label in (("floor", "floor (bare restore -> exec)"),
                              ("create", "create -> first exec")):
            print()
            for side in SIDES:
                print(line(f"{side}: {label}", times[(side, metric)], width=44))
            ratio = pct(times[(SIDES[1], metric)], 50) / pct(times[(SIDES[0], metric)], 50)
            print(f"without / with p50 {ratio:.2f}")
        print()
        for side in SIDES:
            rt = sides[side][0]
            wakeups = await wakeups_per_second(rt)
            cost = await idle_cost(rt, args.idle, args.idle_window)
            print(f"{side}: one idle VM's QEMU {wakeups:.0f} wakeups/s; {args.idle} idle: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in cost.items()))


if __name__ == "__main__":
    asyncio.run(main())
