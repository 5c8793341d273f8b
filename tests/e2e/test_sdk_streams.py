"""Background processes followed live through the SDK (sync and async) against a live
`pandastack serve` on one real VM: a process printing a line a second is streamed line by
line while it still runs (each line's event comes before the exit, and the process is still
listed as running when its first line arrives); a second client's `connect` replays what was
printed before it attached, then follows live; the ring's 1 MiB bound is told as `dropped`;
`timeout_seconds` kills the process and its exit and listing say so."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pandastack import AsyncSandbox, Sandbox
from pandastack.sdk import ProcessEvent
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(600)]

RING = 1 << 20


@pytest.fixture(scope="module")
def sbx(live_server: LiveServer) -> Iterator[Sandbox]:
    with Sandbox.create(template="base", ttl_seconds=600, **creds_of(live_server)) as s:
        assert s.is_running()
        yield s


def creds_of(live_server: LiveServer) -> dict[str, Any]:
    return {"api_url": live_server.api_url, "api_key": live_server.api_key}


def test_a_line_a_second_is_streamed_line_by_line(sbx: Sandbox) -> None:
    lines: list[str] = []
    # After its first line the process waits for the test's gate file (a bounded 120 s), so
    # it still runs when listed, however slow the listing (3 s of sleeps did not always last).
    gate = "/tmp/streams-first-line-seen"
    proc = sbx.commands.start(f"echo line1; for _ in $(seq 1200); do [ -e {gate} ] && break; "
                              "sleep 0.1; done; for i in 2 3; do sleep 1; echo line$i; done",
                              on_stdout=lines.append)
    events: list[ProcessEvent] = []
    running_at_first_line: bool | None = None
    for event in proc.stream():
        events.append(event)
        if event.type == "stdout" and running_at_first_line is None:
            listed = {p.pid: p for p in sbx.commands.list()}
            running_at_first_line = listed[proc.pid].running
            sbx.commands.run(f"touch {gate}")
    assert running_at_first_line is True  # the first line came while the process ran
    outs = [e.data for e in events if e.type == "stdout"]
    assert outs == ["line1\n", "line2\n", "line3\n"]  # one event per line, in order
    assert [e.type for e in events][-1] == "exit" and [e.type for e in events].count("exit") == 1
    result = events[-1].result
    assert result is not None and result.exit_code == 0 and result.stdout == "".join(outs)
    assert lines == outs  # the callback saw each chunk as stream() read it


def test_connect_replays_what_came_before_then_follows(sbx: Sandbox,
                                                       live_server: LiveServer) -> None:
    proc = sbx.commands.start("echo before; echo warn >&2; read x; echo after $x")
    # The first client sees the process print, then leaves (the process runs on).
    for event in proc.stream():
        if event.type == "stdout":
            assert event.data == "before\n"
            break

    async def second_client() -> list[ProcessEvent]:
        # Not as a context manager: that would kill the sandbox on the way out.
        other = await AsyncSandbox.connect(sbx.id, **creds_of(live_server))
        try:
            follower = await other.commands.connect(proc.pid)
            seen: list[ProcessEvent] = []
            async for event in follower.stream():
                seen.append(event)
                if event.type == "stderr":  # the replay is complete: now feed it
                    await follower.send_stdin("now\n")
            return seen
        finally:
            await other.close()

    seen = asyncio.run(second_client())
    assert [(e.type, e.data) for e in seen[:2]] == [("stdout", "before\n"),
                                                  ("stderr", "warn\n")]
    assert [(e.type, e.data) for e in seen[2:-1]] == [("stdout", "after now\n")]
    assert seen[-1].type == "exit" and seen[-1].result is not None
    assert seen[-1].result.stdout == "before\nafter now\n"


def test_the_ring_bound_is_told_and_the_timeout_kills(sbx: Sandbox) -> None:
    over = 200_000
    big = sbx.commands.start(f"head -c {RING + over} /dev/zero | tr '\\0' a")
    assert big.wait().exit_code == 0
    events = list(big.stream())
    assert events[0].type == "dropped" and events[0].dropped == {"stdout": over, "stderr": 0}
    assert sum(len(e.data) for e in events if e.type == "stdout") == RING

    slow = sbx.commands.start("echo up; sleep 300", timeout_seconds=2)
    result = slow.wait()
    assert result.timed_out and result.exit_code == 137 and result.stdout == "up\n"
    listed = {p.pid: p for p in sbx.commands.list()}
    assert listed[slow.pid].timed_out and not listed[slow.pid].running
