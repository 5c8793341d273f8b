"""An incremental `text/event-stream` decoder (the WHATWG server-sent events format). No I/O.

Feed it bytes exactly as they come off the socket; chunks may split anything: a UTF-8 sequence,
a CRLF pair, a field name. It returns the events completed by each chunk.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

__all__ = ["SSEDecoder", "ServerSentEvent"]

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event."""

    event: str
    data: str
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Turns a byte stream into `ServerSentEvent`s, one `feed()` per chunk, `close()` at EOF."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._after_cr = False  # the last chunk ended in "\r": a leading "\n" belongs to it
        self._started = False
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode one chunk; return the events it completed (possibly none)."""
        return self._feed_text(self._text.decode(chunk))

    def close(self) -> list[ServerSentEvent]:
        """End of stream: flush what is left.

        The standard drops an event that lacks its closing blank line; we dispatch it instead,
        since a truncated final event still carries the information.
        """
        events = self._feed_text(self._text.decode(b"", final=True))
        if self._buffer:
            line, self._buffer = self._buffer, ""
            self._line(line, events)
        self._dispatch(events)
        return events

    def _feed_text(self, text: str) -> list[ServerSentEvent]:
        events: list[ServerSentEvent] = []
        if not text:
            return events
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._after_cr:
            self._after_cr = False
            text = text.removeprefix("\n")
        buf = self._buffer + text
        pos = 0
        for match in _EOL.finditer(buf):
            self._line(buf[pos:match.start()], events)
            pos = match.end()
            if match.group() == "\r" and pos == len(buf):
                self._after_cr = True
        self._buffer = buf[pos:]
        return events

    def _line(self, line: str, events: list[ServerSentEvent]) -> None:
        if not line:
            self._dispatch(events)
            return
        if line.startswith(":"):
            return  # comment / keep-alive
        name, sep, value = line.partition(":")
        if sep:
            value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)

    def _dispatch(self, events: list[ServerSentEvent]) -> None:
        if self._data:
            events.append(ServerSentEvent(event=self._event or "message",
                                          data="\n".join(self._data), id=self._id,
                                          retry=self._retry))
        self._event = ""
        self._data = []
        self._retry = None
