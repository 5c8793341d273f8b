"""Exec latency in a running sandbox, first and repeated, with guest ASLR off and on.

An agent's loop runs many short commands in one sandbox. Under TCG each QEMU process keeps
one translation cache for all guest processes, keyed by virtual address: with address-space
randomization every new process maps its shared libraries somewhere new and translates them
again. For each setting (its own template, baked on first use) and each command, N sandboxes
each run the command once cold and M times again; printed: p50/p99 of the first and of the
repeats, and the repeats' p50 ratio of ASLR off to on (on is the floor: Linux's default).

Usage: python bench/exec.py [--sandboxes 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import line, pct, temp_runtime

COMMANDS: dict[str, list[str]] = {
    "true": ["true"],
    "sh -c 'ls /'": ["sh", "-c", "ls / >/dev/null"],
    "python3 -c print(1)": ["python3", "-c", "print(1)"],
}


async def measure(aslr: str, sandboxes: int, repeats: int) -> dict[str, tuple[list[float],
                                                                                list[float]]]:
    results: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in COMMANDS}
    async with temp_runtime(f"psb-exec-{aslr}-", guest_aslr=aslr) as (rt, _):
        await rt.ensure_template("base")
        for _ in range(sandboxes):
            sbx = await rt.create("base")
            for name, argv in COMMANDS.items():
                first, again = results[name]
                for i in range(1 + repeats):
                    t0 = time.perf_counter()
                    result = await sbx.exec(argv)
                    (first if i == 0 else again).append((time.perf_counter() - t0) * 1000)
                    assert result.exit_code == 0, result
            await rt.kill(sbx.id)
    return results


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandboxes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = {aslr: await measure(aslr, args.sandboxes, args.repeats) for aslr in ("off", "on")}
    for name in COMMANDS:
        for aslr, results in runs.items():
            first, again = results[name]
            print(line(f"{name}, ASLR {aslr}, first", first))
            print(line(f"{name}, ASLR {aslr}, repeated", again))
        off, on = pct(runs["off"][name][1], 50), pct(runs["on"][name][1], 50)
        print(f"{name}: repeated p50 ratio ASLR off / on = {off / on:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
