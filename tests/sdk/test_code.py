"""The code-interpreter stream decoder and result helpers (pure logic, no server)."""

from __future__ import annotations

import base64
import json

import pytest

from pandastack.sdk._code import CodeStreamDecoder, Execution, Result
from pandastack.sdk.errors import NotFoundError, ProtocolError

PNG = b"\x89PNG\r\n\x1a\nrest"


def frame(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


STREAM = b"".join([
    frame("stdout", {"data": "hé"}),
    frame("stderr", {"data": "warn\n"}),
    frame("result", {"data": {"image/png": base64.b64encode(PNG).decode()},
                     "is_main_result": False, "newer_field": 1}),
    frame("future-event", {"x": 1}),
    frame("result", {"data": {"text/plain": "42", "application/json": "{\"a\": 1}"},
                     "is_main_result": True}),
    frame("error", {"name": "ValueError", "value": "bad", "traceback": "tb"}),
    frame("end", {"execution_count": 3}),
    frame("stdout", {"data": "after end: ignored"}),
])


def test_decoder_whole_and_split() -> None:
    for size in (len(STREAM), 1, 7):
        decoder = CodeStreamDecoder()
        events = []
        for i in range(0, len(STREAM), size):
            events += decoder.feed(STREAM[i:i + size])
        events += decoder.close()
        assert [e.type for e in events] == ["stdout", "stderr", "result", "result", "error",
                                            "end"]
        execution = decoder.result()
        assert execution.stdout == "hé" and execution.stderr == "warn\n"
        assert execution.text == "42" and execution.execution_count == 3
        assert execution.results[0].png_bytes() == PNG
        assert execution.results[1].json == {"a": 1}
        assert execution.error is not None and execution.error.name == "ValueError"


def test_failure_event_raises_the_api_error() -> None:
    decoder = CodeStreamDecoder()
    body = {"error": {"code": "not_found", "message": "code context c1 not found",
                      "request_id": "req_1"}}
    with pytest.raises(NotFoundError, match="c1"):
        decoder.feed(frame("failure", body))


def test_stream_without_end_is_a_protocol_error() -> None:
    decoder = CodeStreamDecoder()
    decoder.feed(frame("stdout", {"data": "x"}))
    with pytest.raises(ProtocolError):
        decoder.result()


def test_result_helpers() -> None:
    r = Result(data={"text/plain": "t", "text/html": "<b>", "image/svg+xml": "<svg/>"})
    assert (r.text, r.html, r.svg, r.png, r.json) == ("t", "<b>", "<svg/>", None, None)
    assert r.formats() == ["text/plain", "text/html", "image/svg+xml"]
    assert Execution().text is None
