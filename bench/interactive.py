"""Interactive sandboxes (issue 19): each measure below runs on its own and prints its lines;
`MEASURES` lists them. Run all, or some with `--only NAME`.

- **watch**: how long after a file change is asked for its event arrives. A sandbox of a
  host runtime in this process watches /work/w; the host then writes a new file (events
  `create` and `write`), renames it (`rename`) and removes it (`remove`) through the guest
  agent, each step waiting for its events before the next. Timed per event, from the moment
  the host sent the request to the moment the event came out of the watch; the request's own
  round trip (until the guest acknowledged it) is printed beside it, since the event can only
  be as early as the change itself. With `--api`, the same through a real `pandastack serve`
  and the SDK (`sbx.files.watch` iterated in a thread; the changes by `sbx.files`): what an
  agent sees. The acceptance line: each event within 200 ms.

Usage: python bench/interactive.py [--only watch] [--n 50] [--api]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from common import line, temp_runtime
from pandastack.hostport.watch import WatchEvent

Measure = Callable[[argparse.Namespace], Awaitable[list[str]]]
STEPS = ("create", "write", "rename", "remove")


class Events:
    """The events of a watch as they arrive, each with the time it came out."""

    def __init__(self, batches: AsyncIterator[list[WatchEvent]]) -> None:
        self._batches = batches
        self._pending: list[tuple[WatchEvent, float]] = []

    async def until(self, kind: str, path: str) -> float:
        while True:
            while self._pending:
                event, at = self._pending.pop(0)
                if event.type == kind and event.path == path:
                    return at
            batch = await asyncio.wait_for(anext(self._batches), 10)
            at = time.perf_counter()
            self._pending += [(e, at) for e in batch]


async def watch(args: argparse.Namespace) -> list[str]:
    lat: dict[str, list[float]] = {k: [] for k in STEPS}
    acks: dict[str, list[float]] = {k: [] for k in ("write_file", "rename", "remove")}
    async with temp_runtime("psb-watch-") as (rt, _):
        await rt.ensure_template("base")
        sbx = await rt.create("base")
        agent = await sbx.agent()
        await agent.mkdir("/work/w")
        batches = agent.watch("/work/w")
        assert (await anext(batches))[0].type == "watching"
        events = Events(batches)
        for i in range(args.n + 1):  # the first round warms up, untimed
            a, b = f"/work/w/f{i}", f"/work/w/g{i}"
            t0 = time.perf_counter()
            await agent.write_file(a, b"x")
            ack = time.perf_counter()
            created, written = await events.until("create", a), await events.until("write", a)
            t1 = time.perf_counter()
            await agent.rename(a, b)
            ack1 = time.perf_counter()
            renamed = await events.until("rename", b)
            t2 = time.perf_counter()
            await agent.remove(b)
            ack2 = time.perf_counter()
            removed = await events.until("remove", b)
            if i == 0:
                continue
            for k, v in zip(STEPS, (created - t0, written - t0, renamed - t1, removed - t2),
                            strict=True):
                lat[k].append(v * 1000)
            for k, v in zip(acks, (ack - t0, ack1 - t1, ack2 - t2), strict=True):
                acks[k].append(v * 1000)
        await batches.aclose()  # type: ignore[attr-defined]
    out = [line(f"watch (host) {k} event", v) for k, v in lat.items()]
    out += [line(f"  guest op {k} acknowledged", v) for k, v in acks.items()]
    if args.api:
        out += await asyncio.to_thread(watch_api, args.n)
    return out


def watch_api(n: int) -> list[str]:
    from api import live_server  # bench/api.py: a real `pandastack serve`
    from pandastack import Sandbox

    lat: dict[str, list[float]] = {k: [] for k in STEPS}
    with tempfile.TemporaryDirectory(prefix="psb-watch-api-", dir="/tmp") as tmp, \
            live_server(Path(tmp)) as server, \
            Sandbox.create(api_url=server.api_url, api_key=server.api_key,
                           ttl_seconds=600) as sbx:
        sbx.files.mkdir("/work/w")
        w = sbx.files.watch("/work/w")
        arrived: queue.Queue[tuple[str, str, float]] = queue.Queue()

        def pump() -> None:
            for e in w:
                arrived.put((e.type, e.path, time.perf_counter()))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()

        def until(kind: str, path: str) -> float:
            while True:
                k, p, at = arrived.get(timeout=10)
                if (k, p) == (kind, path):
                    return at

        for i in range(n + 1):
            a, b = f"/work/w/f{i}", f"/work/w/g{i}"
            t0 = time.perf_counter()
            sbx.files.write(a, "x")
            created, written = until("create", a), until("write", a)
            t1 = time.perf_counter()
            sbx.files.rename(a, b)
            renamed = until("rename", b)
            t2 = time.perf_counter()
            sbx.files.remove(b)
            removed = until("remove", b)
            if i:
                for k, v in zip(STEPS, (created - t0, written - t0, renamed - t1,
                                        removed - t2), strict=True):
                    lat[k].append(v * 1000)
        w.stop()
        reader.join(10)
    return [line(f"watch (API, SDK) {k} event", v) for k, v in lat.items()]


MEASURES: dict[str, Measure] = {"watch": watch}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(MEASURES), action="append")
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--api", action="store_true", help="also through serve and the SDK")
    args = parser.parse_args()
    for name in args.only or MEASURES:
        for text in await MEASURES[name](args):
            print(text)


if __name__ == "__main__":
    asyncio.run(main())
