"""Background processes followed live, against the REAL guest agent in test mode (no VM):
an attach opens with the rings' replay note (what they dropped), `timeout_ms` of a spawn
kills the process and its exit says so, and a stream that keeps nothing still sees it all;
`spawn_attach` tells the pid before the output, and leaving it leaves the process running.
A scripted hostile guest cannot pass a count that is not one to the host's callbacks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pandastack.guest.procs import RING_BYTES
from pandastack.guestproto import frames as P
from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import AgentProtocolError
from tests.host.agentlink.test_agent_client import local_agent
from tests.host.fake_guest import FakeGuest, in_thread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def agent() -> AsyncIterator[AgentClient]:
    async with local_agent() as client:
        yield client


async def test_attach_says_what_the_rings_dropped(agent: AgentClient) -> None:
    over = 300_000
    pid = await agent.spawn(f"head -c {RING_BYTES + over} /dev/zero; echo tail >&2")
    first = await agent.attach(pid, timeout=20)  # wait for the exit: all of it is written
    assert first.exit_code == 0
    told: list[tuple[int, int]] = []
    order: list[str] = []

    def dropped(out: int, err: int) -> None:
        told.append((out, err))
        order.append("dropped")

    again = await agent.attach(pid, on_dropped=dropped,
                               on_stdout=lambda b: order.append("stdout"), timeout=20)
    assert told == [(over, 0)]
    assert order[0] == "dropped" and "stdout" in order
    assert len(again.stdout) == RING_BYTES and again.stderr == b"tail\n"


async def test_a_complete_backlog_is_told_as_nothing_dropped(agent: AgentClient) -> None:
    pid = await agent.spawn("echo one; echo two >&2")
    told: list[tuple[int, int]] = []
    result = await agent.attach(pid, on_dropped=lambda o, e: told.append((o, e)), timeout=10)
    assert told == [(0, 0)]
    assert (result.stdout, result.stderr) == (b"one\n", b"two\n")


async def test_spawn_timeout_kills_it_and_the_exit_says_so(agent: AgentClient) -> None:
    pid = await agent.spawn("echo up; sleep 30", timeout=0.5)
    result = await agent.attach(pid, timeout=20)
    assert result.timed_out and result.exit_code == 137 and result.stdout == b"up\n"
    listed = {p["pid"]: p for p in await agent.procs()}
    assert listed[pid]["timed_out"] is True and listed[pid]["running"] is False


async def test_a_stream_keeping_nothing_still_sees_every_chunk(agent: AgentClient) -> None:
    pid = await agent.spawn("for i in 1 2 3; do echo line$i; done")
    chunks: list[bytes] = []
    result = await agent.attach(pid, on_stdout=chunks.append, max_output=0, timeout=10)
    assert b"".join(chunks) == b"line1\nline2\nline3\n"
    assert result.stdout == b""


async def test_spawn_attach_tells_the_pid_before_the_output(agent: AgentClient) -> None:
    order: list[object] = []
    result = await agent.spawn_attach("echo one; echo two >&2; exit 4",
                                      on_spawned=order.append, on_stdout=order.append,
                                      on_stderr=order.append)
    pid = order[0]
    assert isinstance(pid, int)  # first: stdout and stderr are two pipes, in either order
    assert sorted(order[1:], key=repr) == [b"one\n", b"two\n"]
    assert (result.exit_code, result.stdout, result.stderr) == (4, b"one\n", b"two\n")
    listed = {p["pid"]: p for p in await agent.procs()}
    assert listed[pid]["background"] is True and listed[pid]["exit_code"] == 4


async def test_leaving_a_spawn_attach_leaves_the_process_running(agent: AgentClient) -> None:
    pids: asyncio.Queue[int] = asyncio.Queue()
    call = asyncio.create_task(agent.spawn_attach(
        ["sh", "-c", "read line; echo got $line"], on_spawned=pids.put_nowait))
    pid = await asyncio.wait_for(pids.get(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await agent.send_stdin(pid, b"hi\n", eof=True)
    result = await agent.attach(pid, timeout=20)
    assert (result.exit_code, result.stdout) == (0, b"got hi\n")


async def test_spawn_attach_without_stdin_and_with_a_timeout(agent: AgentClient) -> None:
    pids: list[int] = []
    result = await agent.spawn_attach("cat; echo done", on_spawned=pids.append, stdin=False)
    assert (result.exit_code, result.stdout) == (0, b"done\n")
    result = await agent.spawn_attach("echo up; sleep 30", on_spawned=pids.append,
                                      timeout=0.5, max_output=0)
    assert result.timed_out and result.stdout == b"" and len(pids) == 2


@pytest.mark.parametrize("count", [-1, True, "3"])
async def test_a_replay_note_with_a_bad_count_fails_the_attach(count: object) -> None:
    fake = FakeGuest()
    try:
        client = await fake.client(op_timeout=10)
        told: list[tuple[int, int]] = []
        task = asyncio.create_task(client.attach(7, on_dropped=lambda o, e: told.append((o, e))))
        req = await in_thread(lambda: fake.recv_until("attach"))
        assert isinstance(req, P.Frame)
        await in_thread(lambda: fake.send(P.frame("replay", req.id, stdout_dropped=count,
                                                  stderr_dropped=0)))
        with pytest.raises(AgentProtocolError):
            await asyncio.wait_for(task, 10)
        assert told == []
        await client.close()
    finally:
        fake.close()
