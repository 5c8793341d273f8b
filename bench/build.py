"""Template builds: an uncached build, a rebuild with only the last step changed (the cached
prefix is restored, not redone), and an identical rebuild. The floor, measured in the same run:
the same steps run by hand in one sandbox with no snapshots at all (create, execs, kill).

The steps are offline (no package index): they write files and run Python, so the numbers are
the pipeline's own cost plus the steps' guest time.

Usage: python bench/build.py [--n 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from functools import partial

from common import line as _line
from common import pct, temp_runtime
from pandastack.host.templates.builds import TemplateBuilds
from pandastack.templatespec import Template, TemplateSpec

line = partial(_line, unit="s", width=44)


def commands(steps: int, salt: str, last: str) -> list[str]:
    cmds = [f"python3 -c \"open('/work/s{i}', 'w').write('{salt}' * 10000)\""
            for i in range(steps - 1)]
    return [*cmds, f"echo {last} > /work/last"]


def spec(steps: int, salt: str, last: str) -> TemplateSpec:
    template = Template("base")
    for cmd in commands(steps, salt, last):
        template = template.run(cmd)
    return template.to_spec()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    floor: list[float] = []
    cold: list[float] = []
    last_changed: list[float] = []
    identical: list[float] = []
    async with temp_runtime("psbb-") as (rt, scratch):
        builds = TemplateBuilds(rt, scratch / "build-cache")
        await rt.ensure_template()
        for round_no in range(args.n):
            salt = f"r{round_no}x{time.time_ns()}"  # a fresh chain: nothing cached
            t0 = time.perf_counter()
            sbx = await rt.create()
            for cmd in commands(args.steps, salt, "a"):
                assert (await sbx.exec(cmd)).exit_code == 0
            await rt.kill(sbx.id)
            floor.append(time.perf_counter() - t0)

            results = []
            for label, target, last in (("cold", cold, "a"), ("last", last_changed, "b"),
                                        ("same", identical, "b")):
                t0 = time.perf_counter()
                result = await builds.build(spec(args.steps, salt, last), log=quiet)
                target.append(time.perf_counter() - t0)
                results.append((label, result))
                rt.delete_snapshot(result.snapshot_id)
            print(f"round {round_no}: " + ", ".join(
                f"{label} {r.steps_cached}/{r.steps_total} cached" for label, r in results))
        print(line(f"floor: {args.steps} steps by hand, no snapshots", floor))
        print(line("build, nothing cached", cold))
        print(line("rebuild, last step changed", last_changed))
        print(line("rebuild, nothing changed", identical))
        print(f"ratio cold p50 / floor p50: {pct(cold, 50) / pct(floor, 50):.2f}; "
              f"last-step rebuild saves {pct(cold, 50) - pct(last_changed, 50):.1f} s "
              f"({1 - pct(last_changed, 50) / pct(cold, 50):.0%}) of the cold build")
        builds.prune_cache()


def quiet(text: str) -> None:
    """The build log is not the benchmark."""


if __name__ == "__main__":
    asyncio.run(main())
