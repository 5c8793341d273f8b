"""A hostile guest answering `code` requests: whatever the interpreter in the guest sends, the
host stops at its bounds (results per run, their size, output text, nesting) with a clear
error and cancels the run. The guest is a scripted peer speaking the real wire protocol."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from pandastack.guestproto import frames as P
from pandastack.host.agentlink import code as cc
from pandastack.hostport.errors import AgentLimitError, CodeInterpreterError
from pandastack.hostport.results import CodeEvent
from tests.host.fake_guest import FakeGuest, in_thread, traced_peak

pytestmark = pytest.mark.timeout(120)

MiB = 2**20


def data_frames(op_id: int, lines: Iterator[bytes]) -> Iterator[bytes]:
    """`lines` packed into `data` frames of at most MAX_CHUNK, as the agent relays them."""
    buf = bytearray()
    for line in lines:
        buf += line
        while len(buf) >= P.MAX_CHUNK:
            yield P.frame("data", op_id, bytes(buf[: P.MAX_CHUNK]))
            del buf[: P.MAX_CHUNK]
    if buf:
        yield P.frame("data", op_id, bytes(buf))


def answer_code(fake: FakeGuest, lines: Iterator[bytes]) -> str:
    """Answer the next `code` request with `lines` (then eof); "cancelled" if the host
    cancelled it on the way."""
    req = fake.recv_until("code")
    if fake.stream(req.id, data_frames(req.id, lines)) == "cancelled":
        return "cancelled"
    fake.send(P.frame("eof", req.id, size=0))
    return "done"


def event(obj: dict[str, object]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


async def run_hostile(fake: FakeGuest, lines: Iterator[bytes]) -> tuple[list[CodeEvent], str]:
    """Run code against `lines`; the events seen before the failure, and what the guest saw."""
    client = await fake.client(op_timeout=10)
    guest = asyncio.create_task(in_thread(lambda: answer_code(fake, lines)))
    seen: list[CodeEvent] = []
    try:
        async for e in client.run_code("x"):
            seen.append(e)
    finally:
        outcome = await guest
        await client.close()
    assert isinstance(outcome, str)
    return seen, outcome


def results(n: int, value: str = "1") -> Iterator[bytes]:
    line = event({"type": "result", "data": {"text/plain": value}, "is_main_result": False})
    for _ in range(n):
        yield line
    yield event({"type": "end", "execution_count": 1})


async def test_result_count_bound_cancels_the_run(fake: FakeGuest) -> None:
    """100 000 tiny results (7 MB on the wire, 10x the bound): the run fails at the bound
    and is cancelled, instead of the route collecting 100 000 result objects."""
    client = await fake.client(op_timeout=10)
    guest = asyncio.create_task(in_thread(lambda: answer_code(fake, results(100_000))))
    count = 0
    with pytest.raises(AgentLimitError):
        async for e in client.run_code("x"):
            count += e.type == "result"
    assert count == cc.MAX_RUN_RESULTS
    assert await guest == "cancelled"
    await client.close()


async def test_result_bytes_per_run_are_bounded(
    fake: FakeGuest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cc, "MAX_RUN_RESULT_CHARS", 4 * MiB, raising=False)
    with traced_peak() as peak:
        with pytest.raises(AgentLimitError, match="results"):
            await run_hostile(fake, results(40, "x" * MiB))
        assert peak() < 16 * MiB


async def test_output_text_per_run_is_bounded(
    fake: FakeGuest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cc, "MAX_RUN_TEXT", 2**20, raising=False)
    line = event({"type": "stdout", "text": "y" * 65536})
    with pytest.raises(AgentLimitError, match="output"):
        await run_hostile(fake, iter([line] * 160))


async def test_deeply_nested_event_line_is_an_interpreter_error(fake: FakeGuest) -> None:
    with pytest.raises(CodeInterpreterError, match="JSON"):
        await run_hostile(fake, iter([b"[" * 100_000 + b"\n"]))


async def test_context_answer_lines_are_small(fake: FakeGuest) -> None:
    """A context operation is answered by one short `ok` line: a guest that sends a
    30 MiB line instead fails it at 1 MiB, not at the 40 MiB bound of run events."""
    client = await fake.client(op_timeout=10)
    # The line goes out in pieces, so the guest's own thread holds little of it.
    pieces = [b'{"type":"ok","contexts":["', *[b"c" * 65536] * 480, b'"]}\n']
    guest = asyncio.create_task(in_thread(lambda: answer_code(fake, iter(pieces))))
    with traced_peak() as peak:
        with pytest.raises(CodeInterpreterError, match="line over"):
            await client.list_code_contexts()
        assert peak() < 8 * MiB
    assert await guest == "cancelled"
    await client.close()


async def test_honest_run_within_the_bounds_passes(fake: FakeGuest) -> None:
    lines = iter([event({"type": "stdout", "text": "hi\n"}), *results(3)])
    seen, outcome = await run_hostile(fake, lines)
    assert [e.type for e in seen] == ["stdout", "result", "result", "result", "end"]
    assert outcome == "done"



@pytest.mark.parametrize("line", [
    {"type": "failure", "code": "internal", "message": "m" * (4 * MiB)},
    {"type": "t" * (4 * MiB)},
])
async def test_error_messages_quote_the_guest_briefly(
    fake: FakeGuest, line: dict[str, object]
) -> None:
    """What the interpreter says ends up in an API error message: a short part of it."""
    with pytest.raises(CodeInterpreterError) as ei:
        await run_hostile(fake, iter([event(line)]))
    assert len(str(ei.value)) < 5000
