"""The framing of the host API's streamed bodies (exec and attach output, file reads, code
events, build logs): one frame is a type byte, a 4-byte big-endian payload length and the
payload. A stream is any number of data frames followed by exactly one final frame, RESULT
(the operation's result as JSON) or ERROR (the error envelope of `hostport.host_api.codec`); nothing
may follow it. A stream that ends before its final frame was cut off.

Why frames and not newline-delimited JSON: output and file bodies are bytes, sent as they
are (no base64), and a reader knows the size of what comes before it reads it, so a bound on
that size is checked before anything is buffered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from .errors import HostError

MEDIA_TYPE = "application/x-pandastack-frames"
HEADER = struct.Struct(">BI")
# A code run's single result may be a 40 MiB image (host/agentlink/code.py MAX_EVENT_LINE)
# and travels in one EVENT frame; byte streams are cut into CHUNK-sized frames.
MAX_PAYLOAD = 64 * 2**20
CHUNK = 256 * 2**10


class Kind(IntEnum):
    STDOUT = 1
    STDERR = 2
    DATA = 3  # a file's bytes
    EVENT = 4  # one code event, JSON
    LOG = 5  # one build log line, UTF-8
    REPLAY = 6  # an attach's first frame: what the guest's rings dropped (wire.Replay JSON)
    SPAWNED = 7  # a spawn-attach's first frame: the process's pid (Spawned JSON)
    RESULT = 0x10  # final: the result, JSON
    ERROR = 0x11  # final: the error envelope, JSON


FINAL = frozenset({Kind.RESULT, Kind.ERROR})
_KINDS = {int(k): k for k in Kind}


class FrameError(HostError):
    """A host API stream broke the framing: an unknown type, a payload over MAX_PAYLOAD,
    bytes after the final frame, or an end inside a frame."""


@dataclass(frozen=True)
class Frame:
    kind: Kind
    payload: bytes

    @property
    def final(self) -> bool:
        return self.kind in FINAL


def encode(kind: Kind, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"{kind.name} frame of {len(payload)} bytes is over the "
                         f"{MAX_PAYLOAD} bytes a frame may carry")
    return HEADER.pack(kind, len(payload)) + payload


def encode_chunks(kind: Kind, data: bytes) -> Iterator[bytes]:
    """`data` as frames of at most CHUNK bytes each (none for empty data)."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        yield encode(kind, bytes(view[start:start + CHUNK]))


class Decoder:
    """Incremental: `feed` the body's bytes as they arrive and get the complete frames;
    `end()` when the body ended. Holds at most one frame's bytes."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buf = bytearray()
        self.finished = False

    def feed(self, data: bytes) -> list[Frame]:
        if self.finished and data:
            raise FrameError("bytes after the final frame of a host API stream")
        self._buf += data
        frames: list[Frame] = []
        pos = 0
        while len(self._buf) - pos >= HEADER.size:
            kind_byte, length = HEADER.unpack_from(self._buf, pos)
            kind = _KINDS.get(kind_byte)
            if kind is None:
                raise FrameError(f"unknown frame type 0x{kind_byte:02x} in a host API stream")
            if length > self.max_payload:
                raise FrameError(f"{kind.name} frame announces {length} bytes, over the "
                                 f"{self.max_payload} a frame may carry")
            end = pos + HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append(Frame(kind, bytes(self._buf[pos + HEADER.size:end])))
            pos = end
            if kind in FINAL:
                self.finished = True
                if len(self._buf) > pos:
                    raise FrameError("bytes after the final frame of a host API stream")
                break
        del self._buf[:pos]
        return frames

    def end(self) -> None:
        """The body ended: FrameError if that was inside a frame."""
        if self._buf:
            raise FrameError(f"a host API stream ended inside a frame ({len(self._buf)} "
                             "bytes of it)")
