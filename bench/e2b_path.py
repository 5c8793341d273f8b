"""What the E2B room adds, against our own SDK on the same server in the same run.

- **create -> first command**: `e2b.Sandbox.create("base")` then `commands.run("true")` (E2B's
  REST create, then a Connect `process.Process/Start` stream through the sandbox-port
  listener) against `pandastack.Sandbox.create(template="base")` then `commands.run("true")`
  (our REST create and exec). The kill is not timed. Issue 34's budget: the E2B path adds at
  most 10 ms at p50.
- **first output chunk**: in one warm sandbox each, the time from the call to the first
  stdout chunk of `echo ready; sleep 0.3`: E2B's `commands.run(..., on_stdout=)` against our
  `commands.run(..., on_stdout=)`. Budget: within 10 ms of ours at p50.
- **the same command line on both sides** (a control): E2B's SDK starts every command as
  `/bin/bash -l -c <cmd>` as its default user `user`, ours as `/bin/sh -c <cmd>` as the
  template's user (`root` in `base`). Under TCG a login bash's first run in a freshly restored
  guest costs ~70 ms more than `sh` (its code is translated again in every clone), which is the
  command E2B's SDK chose, not the path. So both figures are also measured with E2B's
  `user="root"` against our SDK running the argv `/bin/bash -l -c <cmd>`: the same process,
  started as the same user, so what is left is what the E2B path adds.

One `pandastack serve` (private state, database and client config; its sandbox-port listener
on its own free port, which `E2B_SANDBOX_URL` names). The two sides alternate, iteration by
iteration, with the order flipped every time, so drift hits both alike; one untimed warm-up
round each comes first. Both SDKs build their HTTP client per `Sandbox.create`, as a user's
first call does.

Usage: python bench/e2b_path.py [--n 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import e2b

from api import Server, free_port, live_server
from common import line, pct
from pandastack import Sandbox

MAX_N = 500
STREAM_CMD = "echo ready; sleep 0.3"
#: E2B's SDK wraps every command in a login bash (its `commands.run`).
LOGIN_BASH = ["/bin/bash", "-l", "-c"]


@contextmanager
def e2b_server(tmp: Path) -> Iterator[tuple[Server, str]]:
    """bench/api.py's server with its sandbox-port listener on a free port: (the server,
    the listener's URL, which E2B_SANDBOX_URL names)."""
    sandbox_port = free_port()
    with live_server(tmp, extra_env={"PANDASTACK_PREVIEW_PORT": str(sandbox_port)}) as server:
        yield server, f"http://127.0.0.1:{sandbox_port}"


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


class Sides:
    def __init__(self, server: Server, sandbox_url: str) -> None:
        self.server = server
        # The three variables a user changes (docs/e2b.md).
        os.environ.update(E2B_API_URL=server.api_url, E2B_SANDBOX_URL=sandbox_url,
                          E2B_API_KEY=server.api_key)

    @staticmethod
    def create_exec(create: Callable[[], Any], run_true: Callable[[Any], Any]) -> float:
        """Create, then run `true` until its result is back; the kill is not timed."""
        box: list[Any] = []

        def run() -> None:
            sbx = create()
            box.append(sbx)
            result = run_true(sbx)
            assert result.exit_code == 0, result
        try:
            return timed(run)
        finally:
            for sbx in box:
                sbx.kill()

    def ours_create_exec(self, same_command: bool = False) -> float:
        return self.create_exec(
            lambda: Sandbox.create(template="base", api_url=self.server.api_url,
                                   api_key=self.server.api_key),
            (lambda sbx: sbx.commands.run([*LOGIN_BASH, "true"])) if same_command
            else (lambda sbx: sbx.commands.run("true")))

    def e2b_create_exec(self, same_command: bool = False) -> float:
        return self.create_exec(
            lambda: e2b.Sandbox.create("base"),
            (lambda sbx: sbx.commands.run("true", user="root")) if same_command
            else (lambda sbx: sbx.commands.run("true")))

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


def alternate(n: int, ops: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each side's figures, the order flipped every iteration; one untimed round first."""
    out: dict[str, list[float]] = {side: [] for side in ops}
    for op in ops.values():
        op()  # warm-up: first template restore, imports, connection setup
    for i in range(n):
        for side in (list(ops) if i % 2 == 0 else list(ops)[::-1]):
            out[side].append(ops[side]())
    return out


def report(title: str, figures: dict[str, list[float]], budget_label: str) -> float:
    """Print both sides and what E2B's adds at p50; return that."""
    print(line(f"{title}, our SDK", figures["ours"]))
    print(line(f"{title}, e2b SDK", figures["e2b"]))
    ours, theirs = pct(figures["ours"], 50), pct(figures["e2b"], 50)
    print(f"{'  ' + budget_label:40s} {theirs - ours:8.1f} ms  (budget 10 ms; ratio "
          f"{theirs / ours:.2f}x)")
    return theirs - ours


def bench(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-e2b-", dir="/tmp"))
    with e2b_server(tmp) as (server, sandbox_url):
        sides = Sides(server, sandbox_url)
        create = alternate(n, {"ours": sides.ours_create_exec, "e2b": sides.e2b_create_exec})
        create_same = alternate(n, {"ours": lambda: sides.ours_create_exec(True),
                                    "e2b": lambda: sides.e2b_create_exec(True)})
        ours = Sandbox.create(template="base", api_url=server.api_url, api_key=server.api_key)
        theirs = e2b.Sandbox.create("base")
        try:
            chunk = alternate(n, {
                "ours": lambda: sides.first_chunk(
                    lambda cb: ours.commands.run(STREAM_CMD, on_stdout=cb)),
                "e2b": lambda: sides.first_chunk(
                    lambda cb: theirs.commands.run(STREAM_CMD, on_stdout=cb))})
            chunk_same = alternate(n, {
                "ours": lambda: sides.first_chunk(
                    lambda cb: ours.commands.run([*LOGIN_BASH, STREAM_CMD], on_stdout=cb)),
                "e2b": lambda: sides.first_chunk(
                    lambda cb: theirs.commands.run(STREAM_CMD, on_stdout=cb, user="root"))})
        finally:
            ours.kill()
            theirs.kill()
    as_is = report("create -> first command", create, "E2B path adds at p50")
    path = report("same command line", create_same, "E2B path adds at p50")
    print(f"{'  so the command E2B sends adds':40s} {as_is - path:8.1f} ms")
    report("first stdout chunk", chunk, "E2B first chunk later at p50")
    report("first chunk, same command", chunk_same, "E2B first chunk later at p50")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    if not 1 <= args.n <= MAX_N:
        parser.error(f"--n must be 1..{MAX_N}")
    bench(args.n)


if __name__ == "__main__":
    main()
