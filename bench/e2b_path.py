"""What the E2B room adds, against our own SDK on the same server in the same run.

- **create -> first command**: `e2b.Sandbox.create("base")` then `commands.run("true")` (E2B's
  REST create, then a Connect `process.Process/Start` stream through the sandbox-port
  listener) against `pandastack.Sandbox.create(template="base")` then `commands.run("true")`
  (our REST create and exec). The kill is not timed. Issue 34's budget: the E2B path adds at
  most 10 ms at p50.
- **first output chunk**: in one warm sandbox each, the time from the call to the first
  stdout chunk of `echo ready; sleep 0.3`: E2B's `commands.run(..., on_stdout=)` against our
  `commands.run(..., on_stdout=)`. Budget: within 10 ms of ours at p50.

One `pandastack serve` (private state, database and client config; its sandbox-port listener
on its own free port, which `E2B_SANDBOX_URL` names). The two sides alternate, iteration by
iteration, with the order flipped every time, so drift hits both alike; one untimed warm-up
round each comes first. Both SDKs build their HTTP client per `Sandbox.create`, as a user's
first call does.

Usage: python bench/e2b_path.py [--n 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import e2b
import httpx

from common import line, pct, stop
from pandastack import Sandbox

MAX_N = 500
SERVER_START_TIMEOUT = 300.0
STREAM_CMD = "echo ready; sleep 0.3"


@dataclass(frozen=True)
class Server:
    api_url: str
    sandbox_url: str
    api_key: str


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(tmp: Path) -> Iterator[Server]:
    port, sandbox_port = free_port(), free_port()
    env = {**os.environ,
           "PANDASTACK_STATE_DIR": str(tmp / "sandboxes"),
           "PANDASTACK_DB": f"sqlite:///{tmp / 'pandastack.db'}",
           "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
           "PANDASTACK_PREVIEW_PORT": str(sandbox_port)}
    url = f"http://127.0.0.1:{port}"
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port),
             "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("server did not come up:\n"
                                       + (tmp / "server.log").read_text()[-3000:])
                time.sleep(0.2)
            key = json.loads((tmp / "client.json").read_text())["api_key"]
            yield Server(url, f"http://127.0.0.1:{sandbox_port}", key)
        finally:
            stop(proc, tmp)


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


class Sides:
    def __init__(self, server: Server) -> None:
        self.server = server
        # The three variables a user changes (docs/e2b.md).
        os.environ.update(E2B_API_URL=server.api_url, E2B_SANDBOX_URL=server.sandbox_url,
                          E2B_API_KEY=server.api_key)

    def ours_create_exec(self) -> float:
        box: list[Sandbox] = []

        def run() -> None:
            sbx = Sandbox.create(template="base", api_url=self.server.api_url,
                                 api_key=self.server.api_key)
            box.append(sbx)
            result = sbx.commands.run("true")
            assert result.exit_code == 0, result
        try:
            return timed(run)
        finally:
            for sbx in box:
                sbx.kill()

    def e2b_create_exec(self) -> float:
        box: list[e2b.Sandbox] = []

        def run() -> None:
            sbx = e2b.Sandbox.create("base")
            box.append(sbx)
            result = sbx.commands.run("true")
            assert result.exit_code == 0, result
        try:
            return timed(run)
        finally:
            for sbx in box:
                sbx.kill()

    @staticmethod
    def first_chunk(run: Callable[[Callable[[str], None]], object]) -> float:
        start = time.perf_counter()
        seen: list[float] = []

        def on_stdout(_chunk: object) -> None:
            if not seen:
                seen.append((time.perf_counter() - start) * 1000)
        run(on_stdout)
        assert seen, "no stdout chunk arrived"
        return seen[0]


def bench(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-e2b-", dir="/tmp"))
    with live_server(tmp) as server:
        sides = Sides(server)
        create = {"ours": [], "e2b": []}  # type: dict[str, list[float]]
        chunk = {"ours": [], "e2b": []}  # type: dict[str, list[float]]
        ops = {"ours": sides.ours_create_exec, "e2b": sides.e2b_create_exec}
        for side in ("ours", "e2b"):
            ops[side]()  # warm-up: first template restore, imports, connection setup
        for i in range(n):
            for side in (("ours", "e2b") if i % 2 == 0 else ("e2b", "ours")):
                create[side].append(ops[side]())
        ours = Sandbox.create(template="base", api_url=server.api_url, api_key=server.api_key)
        theirs = e2b.Sandbox.create("base")
        try:
            runs = {
                "ours": lambda cb: ours.commands.run(STREAM_CMD, on_stdout=cb),
                "e2b": lambda cb: theirs.commands.run(STREAM_CMD, on_stdout=cb),
            }
            for side in ("ours", "e2b"):
                sides.first_chunk(runs[side])
            for i in range(n):
                for side in (("ours", "e2b") if i % 2 == 0 else ("e2b", "ours")):
                    chunk[side].append(sides.first_chunk(runs[side]))
        finally:
            ours.kill()
            theirs.kill()
    print(line("create -> first command, our SDK", create["ours"]))
    print(line("create -> first command, e2b SDK", create["e2b"]))
    added = pct(create["e2b"], 50) - pct(create["ours"], 50)
    print(f"{'  E2B path adds at p50':40s} {added:8.1f} ms  (budget 10 ms; ratio "
          f"{pct(create['e2b'], 50) / pct(create['ours'], 50):.2f}x)")
    print(line("first stdout chunk, our SDK", chunk["ours"]))
    print(line("first stdout chunk, e2b SDK", chunk["e2b"]))
    later = pct(chunk["e2b"], 50) - pct(chunk["ours"], 50)
    print(f"{'  E2B first chunk later at p50':40s} {later:8.1f} ms  (budget 10 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    if not 1 <= args.n <= MAX_N:
        parser.error(f"--n must be 1..{MAX_N}")
    bench(args.n)


if __name__ == "__main__":
    main()
