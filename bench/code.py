"""Code interpreter latency in a `code-interpreter` sandbox.

Per round: create + the first `run_code` (the kernel is already running and warm in the
template snapshot), then N small `run_code` calls on the same kernel, and one matplotlib plot
round trip. The floor, measured in the same run: create + first exec of `true`, and the exec of
`true` on a live sandbox (the agent round trip every run_code also pays).

Usage: python bench/code.py [--n 10] [--calls 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import line, pct, temp_runtime
from pandastack.host.runtime.sandbox import SandboxHandle

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"


async def run(sbx: SandboxHandle, code: str) -> dict[str, object]:
    """The run's error (if any) and whether it produced a PNG."""
    out: dict[str, object] = {"error": None, "png": False}
    async for event in sbx.run_code(code, timeout=120):
        if event.type == "error":
            out["error"] = f"{event.name}: {event.value}"
        if event.type == "result" and event.data and "image/png" in event.data:
            out["png"] = True
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    floor_create: list[float] = []
    floor_exec: list[float] = []
    first: list[float] = []
    calls: list[float] = []
    plots: list[float] = []
    async with temp_runtime("psbc-") as (rt, _):
        await rt.ensure_template("code-interpreter")
        for _ in range(args.n):
            t0 = time.perf_counter()
            plain = await rt.create("code-interpreter")
            await plain.exec(["true"])
            floor_create.append((time.perf_counter() - t0) * 1000)
            for _ in range(3):
                t0 = time.perf_counter()
                await plain.exec(["true"])
                floor_exec.append((time.perf_counter() - t0) * 1000)
            await rt.kill(plain.id)

            t0 = time.perf_counter()
            sbx = await rt.create("code-interpreter")
            result = await run(sbx, "6 * 7")
            first.append((time.perf_counter() - t0) * 1000)
            assert result["error"] is None, result
            for i in range(args.calls):
                t0 = time.perf_counter()
                result = await run(sbx, f"x = {i}\nx * 2")
                calls.append((time.perf_counter() - t0) * 1000)
                assert result["error"] is None, result
            t0 = time.perf_counter()
            result = await run(sbx, PLOT)
            plots.append((time.perf_counter() - t0) * 1000)
            assert result["png"], result
            await rt.kill(sbx.id)
        print(line("floor: create + first exec", floor_create))
        print(line("floor: exec true (live sandbox)", floor_exec))
        print(line("create + first run_code", first))
        print(line("run_code (small cell, warm kernel)", calls))
        print(line("run_code matplotlib plot -> PNG", plots))
        print(f"ratio create+first run_code p50 / floor p50: "
              f"{pct(first, 50) / pct(floor_create, 50):.2f}; "
              f"run_code p50 / exec p50: {pct(calls, 50) / pct(floor_exec, 50):.2f}")


if __name__ == "__main__":
    asyncio.run(main())
