"""The SDK's decoder of the file watch stream (no I/O): `watching` starts it, events become
FileEvents in order, `overflow` is the last event, `end` ends it quietly, `error` raises."""

from __future__ import annotations

import pytest

from pandastack.sdk._watch import WatchDecoder, write_many_call
from pandastack.sdk.errors import InvalidRequestError, NotFoundError

STREAM = (b'event: watching\ndata: {"path":"/w","recursive":true}\n\n'
          b': keep-alive\n\n'
          b'event: create\ndata: {"type":"create","path":"/w/a","old_path":null,"is_dir":false}\n\n'
          b'event: rename\ndata: {"type":"rename","path":"/w/b","old_path":"/w/a",'
          b'"is_dir":false}\n\n')


def test_events_in_order_split_anywhere() -> None:
    for cut in range(len(STREAM)):
        d = WatchDecoder()
        events = d.feed(STREAM[:cut]) + d.feed(STREAM[cut:])
        assert d.started and not d.done
        assert [(e.type, e.path, e.old_path) for e in events] == [
            ("create", "/w/a", None), ("rename", "/w/b", "/w/a")]


def test_overflow_is_the_last_event_and_end_is_quiet() -> None:
    d = WatchDecoder()
    events = d.feed(b'event: overflow\ndata: {"type":"overflow","path":"/w"}\n\n'
                    b'event: create\ndata: {"type":"create","path":"/w/late"}\n\n')
    assert [e.type for e in events] == ["overflow"] and d.done
    d = WatchDecoder()
    assert d.feed(b'event: end\ndata: {"reason":"removed"}\n\n') == [] and d.done


def test_error_event_raises_its_error() -> None:
    d = WatchDecoder()
    with pytest.raises(NotFoundError):
        d.feed(b'event: error\ndata: {"error":{"code":"not_found","message":"gone",'
               b'"request_id":"r"}}\n\n')


def test_write_many_is_checked_before_sending() -> None:
    call = write_many_call("sbx-1", [("/a", "text"), ("/b", b"\x00\xff")])
    assert call.json == {"files": [{"path": "/a", "data": "text"},
                                   {"path": "/b", "data": "AP8=", "encoding": "base64"}]}
    with pytest.raises(InvalidRequestError):
        write_many_call("sbx-1", [])
