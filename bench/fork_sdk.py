"""`bench/fork.py --sdk`: fork through a real `pandastack serve` and the Python SDK.

Each round, in an order that flips every round so drift hits both alike: a create
(`client.sandboxes.create`) until it returns, then its first exec; and `parent.fork(count=1)`
until it returns (the child's agent has answered), then the child's first exec. Then
`fork(count=3)` rounds: until it returns (per child: that / 3), then each child's first exec,
one after the other. The parent's pause is what the API's fork answer reports
(`parent_pause_ms`), beside the server's own time for the fork (`duration_ms`: from the
host call to the children recorded). Kills are not timed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from api import live_server
from common import line, pct
from fork import DIRTY
from pandastack import Client, Sandbox

TTL = 900
WARM_FORKS = 3  # the first forks prepare the server's fork buffer and huge page pool


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


def make_dirty(client: Client, mb: int) -> Sandbox:
    sbx = client.sandboxes.create(template="base", ttl_seconds=TTL)
    sbx.files.write("/work/dirty.py", DIRTY.encode())
    sbx.exec(f"nohup python3 /work/dirty.py {mb} >/dev/null 2>&1 &")
    deadline = time.monotonic() + 300
    while sbx.exec(["test", "-e", "/work/dirty.ready"]).exit_code != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the dirtying process did not finish")
        time.sleep(0.5)
    return sbx


def first_exec(sbx: Sandbox) -> float:
    started = time.perf_counter()
    result = sbx.exec(["true"])
    assert result.exit_code == 0, result
    return _ms(started)


def sdk_main(n: int, dirty_mb: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="psbf-sdk-", dir="/tmp"))
    created: list[float] = []
    created_exec: list[float] = []
    one: list[float] = []
    one_exec: list[float] = []
    one_pause: list[float] = []
    one_server: list[float] = []
    trio: list[float] = []
    trio_exec: list[float] = []
    trio_pause: list[float] = []
    trio_server: list[float] = []
    try:
        with live_server(tmp) as server, Client(server.api_url, server.api_key) as client:
            parent = make_dirty(client, dirty_mb)
            print(f"parent {parent.id} holds {dirty_mb} MB of dirty memory")
            for i in range(WARM_FORKS):
                started = time.perf_counter()
                (kid,) = parent.fork(count=1)
                first_exec(kid)
                print(f"untimed fork {i + 1} to child's 1st exec: {_ms(started):.1f} ms")
                kid.kill()

            def create_round() -> None:
                started = time.perf_counter()
                sbx = client.sandboxes.create(template="base", ttl_seconds=TTL)
                created.append(_ms(started))
                created_exec.append(first_exec(sbx))
                sbx.kill()

            def fork_round() -> None:
                started = time.perf_counter()
                kids = parent.fork(count=1)
                one.append(_ms(started))
                one_exec.append(first_exec(kids[0]))
                one_server.append(kids.duration_ms)
                if kids.parent_pause_ms is not None:
                    one_pause.append(kids.parent_pause_ms)
                kids[0].kill()

            for i in range(n):
                for step in (create_round, fork_round)[::1 if i % 2 else -1]:
                    step()

            for _ in range(max(2, n // 2)):
                started = time.perf_counter()
                kids = parent.fork(count=3)
                trio.append(_ms(started))
                trio_exec.extend(first_exec(kid) for kid in kids)
                trio_server.append(kids.duration_ms)
                if kids.parent_pause_ms is not None:
                    trio_pause.append(kids.parent_pause_ms)
                for kid in kids:
                    kid.kill()
            parent.kill()

        print(line("floor: SDK create, until it returns", created, width=40))
        print(line("  its first exec", created_exec, width=40))
        both = [a + b for a, b in zip(created, created_exec, strict=True)]
        print(line("  create + first exec", both, width=40))
        print(line("fork(count=1), until it returns", one, width=40))
        print(line("  the child's first exec", one_exec, width=40))
        print(line("  the server's fork (duration_ms)", one_server, width=40))
        if one_pause:
            print(line("  parent pause (API's answer)", one_pause, width=40))
        print(line("fork(count=3), until it returns", trio, width=40))
        print(line("  per child (total / 3)", [t / 3 for t in trio], width=40))
        print(line("  each child's first exec", trio_exec, width=40))
        print(line("  the server's fork (duration_ms)", trio_server, width=40))
        if trio_pause:
            print(line("  parent pause (API's answer)", trio_pause, width=40))
        print(f"fork(count=1) ready p50 / create p50: {pct(one, 50) / pct(created, 50):.2f}; "
              f"fork(count=3) per child p50: {pct(trio, 50) / 3:.1f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
