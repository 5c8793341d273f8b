"""Call builders and the event decoder of file watching (`GET .../files/watch`, Server-Sent
Events) and of `files/batch` (many files in one request). No I/O: `sdk/watch.py` and
`sdk/filesystem.py` run them."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import httpx

from pandastack.sdk._base import (
    Call,
    _bool,
    encode,
    error_from_event,
    ignore_body,
    model_decoder,
    parse_model,
    sandbox_path,
    wire_json,
    with_read_timeout,
)
from pandastack.sdk._sse import SSEDecoder
from pandastack.sdk.errors import ProtocolError
from pandastack.wire import sandboxes as wire
from pandastack.wire.sandboxes import FileEvent, WriteManyResult

__all__ = ["FileEvent", "WatchDecoder", "watch_call", "write_many_call"]

WATCH_EVENTS = frozenset({"create", "write", "remove", "rename", "chmod"})


def watch_call(sandbox_id: str, path: str, *, recursive: bool,
               base_timeout: httpx.Timeout) -> Call[None]:
    # No read timeout: a quiet directory sends only keep-alives, and may send nothing for long.
    return Call("GET", sandbox_path(sandbox_id, "files", "watch"), ignore_body,
                params={"path": path, "recursive": _bool(recursive)},
                headers={"Accept": "text/event-stream"},
                timeout=with_read_timeout(base_timeout, None))


def write_many_call(sandbox_id: str,
                    files: Sequence[tuple[str, str | bytes]]) -> Call[WriteManyResult]:
    items: list[dict[str, object]] = []
    for path, data in files:
        if isinstance(data, str):
            items.append({"path": path, "data": data})
        else:
            items.append({"path": path, "data": base64.b64encode(bytes(data)).decode(),
                          "encoding": "base64"})
    body = encode(wire.WriteManyRequest, files=items)  # 422 here, before anything is sent
    return Call("POST", sandbox_path(sandbox_id, "files", "batch"),
                model_decoder(WriteManyResult), json=body)


class WatchDecoder:
    """Turns the watch stream into `FileEvent`s. `started` once the `watching` event came;
    `done` after `overflow` (returned as the last event) or `end` (not returned); an `error`
    event raises its APIError."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()
        self.started = False
        self.done = False

    def feed(self, chunk: bytes) -> list[FileEvent]:
        return self._handle(self._sse.feed(chunk))

    def close(self) -> list[FileEvent]:
        return self._handle(self._sse.close())

    def _handle(self, events: Sequence[object]) -> list[FileEvent]:
        out: list[FileEvent] = []
        for event in events:
            name, data = getattr(event, "event", ""), getattr(event, "data", "")
            if self.done:
                break
            if name == "watching":
                self.started = True
            elif name in WATCH_EVENTS or name == "overflow":
                try:
                    payload = wire_json(data)
                except ValueError as exc:
                    raise ProtocolError(f"file watch: {name} event is not JSON") from exc
                out.append(parse_model(FileEvent, payload, "file watch"))
                if name == "overflow":
                    self.done = True
            elif name == "end":
                self.done = True
            elif name == "error":
                self.done = True
                raise error_from_event(data)
        return out
