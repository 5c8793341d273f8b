"""The event-stream decoder, fed whole and split at every possible byte."""

from __future__ import annotations

import random

from pandastack.sdk._commands import ExecStreamDecoder
from pandastack.sdk._sse import ServerSentEvent, SSEDecoder
from tests.sdk.fakes import exec_result, sse

STREAM = (
    "\ufeff: keep-alive comment\r\n"
    'event: stdout\r\ndata: {"data": "héllo wörld ✓"}\r\n\r\n'
    "event: stderr\ndata: line one\ndata: line two\n\n"
    'id: 7\rretry: 1500\revent: exit\rdata:{"exit_code": 0}\r\r'
    "data: no event name\n\n"
    "event: ignored-without-data\n\n"
).encode()

EXPECTED = [
    ServerSentEvent("stdout", '{"data": "héllo wörld ✓"}'),
    ServerSentEvent("stderr", "line one\nline two"),
    ServerSentEvent("exit", '{"exit_code": 0}', id="7", retry=1500),
    ServerSentEvent("message", "no event name", id="7"),
]


def decode(chunks: list[bytes]) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    return events + decoder.close()


def test_whole_stream() -> None:
    assert decode([STREAM]) == EXPECTED


def test_split_at_every_byte_boundary() -> None:
    # Splits land inside multi-byte UTF-8 sequences, CRLF pairs and field names.
    for cut in range(len(STREAM) + 1):
        assert decode([STREAM[:cut], STREAM[cut:]]) == EXPECTED, cut


def test_one_byte_at_a_time() -> None:
    assert decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_random_chunkings() -> None:
    rng = random.Random(1234)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 12)))
        chunks = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
        assert decode(chunks) == EXPECTED


def test_final_event_without_blank_line_is_flushed_on_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: exit\ndata: {}") == []
    assert decoder.close() == [ServerSentEvent("exit", "{}")]


def test_events_complete_as_soon_as_their_blank_line_arrives() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: stdout\ndata: x\n") == []
    assert decoder.feed(b"\n") == [ServerSentEvent("stdout", "x")]


def test_exec_stream_decoder_accumulates_and_stops_at_exit() -> None:
    body = sse(
        ("stdout", {"data": "a"}),
        ("stderr", {"data": "E"}),
        ("stdout", {"data": "b"}),
        ("progress", {"pct": 50}),
        ("exit", exec_result(exit_code=3)),
        ("stdout", {"data": "after exit"}),
    )
    decoder = ExecStreamDecoder()
    seen = []
    for i in range(len(body)):
        seen += decoder.feed(body[i : i + 1])
    assert seen == [("stdout", "a"), ("stderr", "E"), ("stdout", "b")]
    assert decoder.done
    result = decoder.result()
    assert (result.exit_code, result.stdout, result.stderr) == (3, "ab", "E")
