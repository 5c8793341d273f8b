"""What the jailed VMM (ADR 0036) costs on create, and how much memory its cgroup must allow.

One runtime, the jail switched on and off on its driver between creates (alternating, so
both see the same load on this shared machine): each create timed from the call to the end
of its first exec (`true`); p50/p99 of each and the ratio of the p50s. Then, jailed, the peak
memory a sandbox's cgroup charged (memory.max_usage_in_bytes, cgroup v1) after its create and
a first exec, and after a fork of it (the stream its QEMU writes is charged to it), against
its guest RAM: the overhead the limit must leave (jail.OVERHEAD_MB).

Usage: python bench/jail.py [--n 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import line, pct, temp_runtime
from pandastack.host.vmm import cgroups
from pandastack.host.vmm.qemu import QemuDriver


def _peak_mb(name: str) -> float:
    path = cgroups.CGROUP_ROOT / "memory" / cgroups.PARENT / name / "memory.max_usage_in_bytes"
    return int(path.read_text()) / (1 << 20)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    async with temp_runtime("pst-bench-jail-") as (rt, _scratch):
        await rt.ensure_template("base")
        driver = rt.driver
        assert isinstance(driver, QemuDriver)
        settings = driver.jail
        if settings is None:
            raise SystemExit("the jail is off here (PANDASTACK_JAIL=off, or not root)")
        times: dict[str, list[float]] = {"on": [], "off": []}
        for i in range(2 * args.n + 2):
            mode = "on" if i % 2 else "off"
            driver.jail = settings if mode == "on" else None
            started = time.perf_counter()
            sbx = await rt.create("base")
            result = await sbx.exec(["true"])
            elapsed = (time.perf_counter() - started) * 1000
            assert result.exit_code == 0
            await rt.kill(sbx.id)
            if i >= 2:  # one warm-up create of each
                times[mode].append(elapsed)
        for mode in ("off", "on"):
            print(line(f"create -> first exec, jail {mode}", times[mode]))
        print(f"ratio of p50s (on / off): {pct(times['on'], 50) / pct(times['off'], 50):.3f}")

        driver.jail = settings
        if cgroups.is_v2():
            return  # the peak is a v1 file
        peaks: list[tuple[float, float]] = []
        for _ in range(3):
            sbx = await rt.create("base")
            await sbx.exec(["sh", "-c", "python3 -c 'print(1)' && ls -R /usr >/dev/null"])
            name = cgroups.cgroup_name(sbx.workdir)
            created = _peak_mb(name)
            fork = await rt.fork(sbx.id, 1)
            forked = _peak_mb(name)
            for child in fork:
                await rt.kill(child.id)
            await rt.kill(sbx.id)
            peaks.append((created, forked))
        for created, forked in peaks:
            print(f"peak charged, 512 MiB guest: after create+exec {created:6.1f} MiB, "
                  f"after a fork {forked:6.1f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
