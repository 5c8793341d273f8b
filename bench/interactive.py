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

- **pty**: keystroke echo round trip of a terminal (a key typed at the guest shell's prompt
  until its echo is read back), on a sandbox of a host runtime in this process, beside two
  floors from the same run: the guest agent's ping and an exec of `true`. With `--api`, the
  same through a real `pandastack serve` and the SDK's WebSocket (`sbx.pty`), beside an exec
  of `true` through the REST API. The target: at most 30 ms p50.

- **background**: first-chunk latency of a background process's live output: from the start
  request until the first line the process prints (`echo ready`) comes out of a stream of its
  output, on a sandbox of a host runtime in this process (spawn, then attach: what the route
  does), beside the spawn alone. With `--api`, through a real `pandastack serve` and the SDK:
  `sbx.commands.start()` until the first `stdout` event of `Process.stream()` (the SSE route),
  beside the start alone.

Usage: python bench/interactive.py [--only watch|pty|background] [--n 50] [--api]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import queue
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from common import line, pct, temp_runtime
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
        await batches.aclose()
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


# -- pty: keystroke echo ------------------------------------------------------------------
# One key typed at the prompt of the guest's shell (bash: readline echoes it) until it is seen
# in the terminal's output; a Ctrl-U every ECHO_LINE keys keeps the line short. The floors,
# measured in the same run on the same sandbox: the guest agent's ping (the channel's own
# round trip, what no keystroke can beat) and a plain exec of `true` (a request/response
# command, what an exec loop would pay per line).
ECHO_LINE = 40
KEYS = b"abcdefghijklmnopqrstuvwxyz"


async def _echo(send: Callable[[bytes], Awaitable[None]],
                receive: Callable[[], Awaitable[bytes]], n: int) -> list[float]:
    out: list[float] = []
    for i in range(n + 5):  # the first few warm up, untimed
        if i % ECHO_LINE == ECHO_LINE - 1:
            await send(b"\x15")
            await _quiet(receive)
            continue
        key = KEYS[i % len(KEYS):i % len(KEYS) + 1]
        t0 = time.perf_counter()
        await send(key)
        seen = b""
        while key not in seen:
            seen += await asyncio.wait_for(receive(), 10)
        if i >= 5:
            out.append((time.perf_counter() - t0) * 1000)
    return out


async def _quiet(receive: Callable[[], Awaitable[bytes]]) -> None:
    """Read until the terminal has been silent for 0.2 s."""
    while True:
        try:
            await asyncio.wait_for(receive(), 0.2)
        except TimeoutError:
            return


async def pty(args: argparse.Namespace) -> list[str]:
    async with temp_runtime("psb-pty-") as (rt, _):
        await rt.ensure_template("base")
        sbx = await rt.create("base")
        agent = await sbx.agent()
        pings = [await agent.ping() for _ in range(args.n + 5)][5:]
        execs = []
        for i in range(args.n + 5):
            t0 = time.perf_counter()
            await agent.exec("true")
            if i >= 5:
                execs.append((time.perf_counter() - t0) * 1000)
        pid = await sbx.pty_create(cols=80, rows=24)
        session = await sbx.pty_connect(pid)

        async def receive() -> bytes:
            item = await session.receive()
            assert isinstance(item, bytes), item
            return item

        await _quiet(receive)  # the prompt
        echo = await _echo(session.send, receive, args.n)
        await sbx.signal(pid, 9)
        await session.close()
    out = [line("pty (host) keystroke echo", echo),
           line("  floor: guest agent ping", pings),
           line("  floor: exec `true`", execs),
           f"  echo p50 / ping p50 {pct(echo, 50) / pct(pings, 50):.1f}x, "
           f"/ exec p50 {pct(echo, 50) / pct(execs, 50):.2f}x"]
    if args.api:
        out += await asyncio.to_thread(pty_api, args.n)
    return out


def pty_api(n: int) -> list[str]:
    from api import live_server  # bench/api.py: a real `pandastack serve`
    from pandastack import Sandbox

    with tempfile.TemporaryDirectory(prefix="psb-pty-api-", dir="/tmp") as tmp, \
            live_server(Path(tmp)) as server, \
            Sandbox.create(api_url=server.api_url, api_key=server.api_key,
                           ttl_seconds=600) as sbx:
        execs = []
        for i in range(n + 5):
            t0 = time.perf_counter()
            sbx.exec("true")
            if i >= 5:
                execs.append((time.perf_counter() - t0) * 1000)
        terminal = sbx.pty.create(cols=80, rows=24)
        pending: queue.Queue[bytes] = queue.Queue()

        def pump() -> None:
            with contextlib.suppress(Exception):  # ends with the kill below
                for chunk in terminal:
                    pending.put(chunk)

        threading.Thread(target=pump, daemon=True).start()

        def quiet() -> None:
            with contextlib.suppress(queue.Empty):
                while True:
                    pending.get(timeout=0.2)

        quiet()  # the prompt
        echo: list[float] = []
        for i in range(n + 5):
            if i % ECHO_LINE == ECHO_LINE - 1:
                terminal.send_stdin(b"\x15")
                quiet()
                continue
            key = KEYS[i % len(KEYS):i % len(KEYS) + 1]
            t0 = time.perf_counter()
            terminal.send_stdin(key)
            seen = b""
            while key not in seen:
                seen += pending.get(timeout=10)
            if i >= 5:
                echo.append((time.perf_counter() - t0) * 1000)
        terminal.kill()
        terminal.disconnect()
    return [line("pty (API, SDK WebSocket) keystroke echo", echo),
            line("  floor: exec `true` (REST)", execs),
            f"  echo p50 / exec p50 {pct(echo, 50) / pct(execs, 50):.2f}x"]


# -- background: first chunk of a process's live output -----------------------------------
FIRST_LINE = "echo ready; exec sleep 60"


async def background(args: argparse.Namespace) -> list[str]:
    first: list[float] = []
    spawns: list[float] = []
    async with temp_runtime("psb-bg-") as (rt, _):
        await rt.ensure_template("base")
        sbx = await rt.create("base")
        for i in range(args.n + 3):  # the first few warm up, untimed
            arrived: asyncio.Future[float] = asyncio.get_running_loop().create_future()

            def on_stdout(_data: bytes, arrived: asyncio.Future[float] = arrived) -> None:
                if not arrived.done():
                    arrived.set_result(time.perf_counter())

            t0 = time.perf_counter()
            pid = await sbx.spawn(FIRST_LINE)
            spawned = time.perf_counter()
            follow = asyncio.create_task(sbx.attach(pid, on_stdout=on_stdout,
                                                    keep_output=False))
            at = await asyncio.wait_for(arrived, 10)
            await sbx.signal(pid, 9)
            await follow
            if i >= 3:
                first.append((at - t0) * 1000)
                spawns.append((spawned - t0) * 1000)
    out = [line("background (host) first chunk after start", first),
           line("  spawn alone", spawns)]
    if args.api:
        out += await asyncio.to_thread(background_api, args.n)
    return out


def background_api(n: int) -> list[str]:
    from api import live_server  # bench/api.py: a real `pandastack serve`
    from pandastack import Sandbox

    first: list[float] = []
    starts: list[float] = []
    with tempfile.TemporaryDirectory(prefix="psb-bg-api-", dir="/tmp") as tmp, \
            live_server(Path(tmp)) as server, \
            Sandbox.create(api_url=server.api_url, api_key=server.api_key,
                           ttl_seconds=600) as sbx:
        for i in range(n + 3):
            t0 = time.perf_counter()
            proc = sbx.commands.start(FIRST_LINE)
            started = time.perf_counter()
            for event in proc.stream():
                if event.type == "stdout":
                    at = time.perf_counter()
                    break
            proc.kill()
            if i >= 3:
                first.append((at - t0) * 1000)
                starts.append((started - t0) * 1000)
    return [line("background (API, SDK SSE) first chunk after start", first),
            line("  start alone (REST)", starts)]


MEASURES: dict[str, Measure] = {"watch": watch, "pty": pty, "background": background}


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
