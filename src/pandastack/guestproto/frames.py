"""Frame codec of the pandastack guest-agent protocol (see spec/guest-protocol.md).

Pure and stdlib-only: the guest agent uses it, and so does the host client
(``pandastack.guestproto.frames``).

A frame is::

    b"PS" | version u8 | flags u8 | header length u32 BE | payload length u32 BE
    | header (UTF-8 JSON object) | payload (raw bytes)

The header always holds ``"t"`` (message type, str) and ``"id"`` (operation id, int).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"PS"
VERSION = 1
"""Version byte of the frame layout."""
PROTOCOL_VERSION = 1
"""Version of the message set, exchanged as ``v`` in ``hello``."""
OLDEST_PROTOCOL_VERSION = 1
"""The oldest message set the host still speaks: a guest agent frozen in a snapshot or a
hibernation before it is refused with a word on rebuilding its template."""
FLAGS = 0

PREFIX = struct.Struct(">2sBBII")
PREFIX_SIZE = PREFIX.size  # 12
MAX_HEADER = 65536
MAX_PAYLOAD = 1 << 20
MAX_FRAME = PREFIX_SIZE + MAX_HEADER + MAX_PAYLOAD
MAX_CHUNK = 256 * 1024
"""Largest payload of a data frame (stdout, stderr, stdin, data)."""
INITIAL_WINDOW = 1 << 20
"""Bytes of a data stream a sender may have in flight before any ``credit``."""
CREDIT_BATCH = 128 * 1024
"""Receivers grant credit once at least this much was consumed (or at stream end)."""
WATCH_FRAME_CREDIT = 4096
"""What an ``events`` frame of a watch costs its sender at least, in credit (and what its
receiver grants back for it): a window of small frames would cost the receiver more in frame
overhead than in bytes, so this bounds their number (window / WATCH_FRAME_CREDIT)."""
MAX_ID = (1 << 53) - 1
HELLO_MAX_HEADER = 4096
"""During resync only frames with a header of at most this size and no payload count."""


class ProtocolError(ValueError):
    """Bytes that are not a valid frame."""


@dataclass(frozen=True, slots=True)
class Frame:
    header: dict[str, Any]
    payload: bytes = b""
    header_size: int = field(default=0, compare=False)
    """Bytes of the header on the wire (0 for frames not decoded from bytes)."""

    @property
    def t(self) -> str:
        t = self.header["t"]
        assert isinstance(t, str)
        return t

    @property
    def id(self) -> int:
        i = self.header["id"]
        assert isinstance(i, int)
        return i


def encode(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """Encode one frame. Raises ProtocolError if it would break the limits."""
    t = header.get("t")
    i = header.get("id")
    if not isinstance(t, str) or not t:
        raise ProtocolError("header needs a non-empty str 't'")
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= MAX_ID:
        raise ProtocolError("header needs an int 'id' in 0..2**53-1")
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) > MAX_HEADER:
        raise ProtocolError(f"header too long: {len(raw)} > {MAX_HEADER}")
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload too long: {len(payload)} > {MAX_PAYLOAD}")
    return PREFIX.pack(MAGIC, VERSION, FLAGS, len(raw), len(payload)) + raw + payload


def frame(t: str, id: int, payload: bytes = b"", **fields: Any) -> bytes:
    """Shorthand: ``frame("exit", 7, code=0)``."""
    return encode({"t": t, "id": id, **fields}, payload)


def parse_prefix(prefix: bytes | bytearray | memoryview) -> tuple[int, int]:
    """Validate the 12-byte prefix; return (header length, payload length)."""
    magic, version, flags, hlen, plen = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise ProtocolError(f"unsupported frame version {version}")
    if flags != FLAGS:
        raise ProtocolError(f"unsupported flags 0x{flags:02x}")
    if not 1 <= hlen <= MAX_HEADER:
        raise ProtocolError(f"header length {hlen} out of range 1..{MAX_HEADER}")
    if plen > MAX_PAYLOAD:
        raise ProtocolError(f"payload length {plen} > {MAX_PAYLOAD}")
    return hlen, plen


MAX_JSON_DEPTH = 512
"""Deepest nesting of arrays and objects an agent accepts in a header or a `code` request.
A fixed number, so both agents (this one and guest-agent/'s) refuse the same inputs: the
interpreter's own limit (json raises RecursionError) depends on the stack in use."""
MAX_INT_DIGITS = 4300
"""Longest integer literal (digits) in JSON from the peer: Python's default int_max_str_digits,
stated so the binary agent can apply the same bound."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[][{}]")


def _nesting(text: str) -> int:
    """Deepest nesting of arrays and objects in valid JSON text."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_json(data: bytes | str, *, max_depth: int | None = None) -> Any:
    """``json.loads`` for bytes from the peer: ValueError for anything that is not JSON,
    including nesting deeper than ``max_depth`` (or too deep for the interpreter: json raises
    RecursionError there) and integers longer than MAX_INT_DIGITS."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:
        if "integer string conversion" in str(e):
            raise ValueError(f"JSON integer longer than {MAX_INT_DIGITS} digits") from None
        raise
    if max_depth is not None:
        text = data if isinstance(data, str) else data.decode("utf-8", "surrogatepass")
        # Counting brackets is cheap; only text that could be too deep is scanned.
        if text.count("[") + text.count("{") > max_depth and _nesting(text) > max_depth:
            raise ValueError("JSON nested too deeply")
    return obj


def parse_header(raw: bytes) -> dict[str, Any]:
    try:
        obj = parse_json(raw.decode("utf-8"), max_depth=MAX_JSON_DEPTH)
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"header is not UTF-8 JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("header is not a JSON object")
    t = obj.get("t")
    i = obj.get("id")
    if not isinstance(t, str) or not t:
        raise ProtocolError("header has no str 't'")
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= MAX_ID:
        raise ProtocolError("header has no valid int 'id'")
    return obj


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes, then take frames with ``next_frame``.

    ``next_frame`` raises ProtocolError at the first invalid frame; the bad bytes stay
    in the buffer, so the caller may ``skip_bad`` and ``scan`` for a resync frame.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.discarded = 0
        """Bytes dropped by ``scan``/``skip_bad``/``clear`` since creation."""

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def __len__(self) -> int:
        return len(self._buf)

    def clear(self) -> None:
        self.discarded += len(self._buf)
        self._buf.clear()

    def _drop(self, n: int) -> None:
        if n > 0:
            self.discarded += n
            del self._buf[:n]

    def skip_bad(self) -> None:
        """Drop the first byte, so a later ``scan`` won't find the same bad frame."""
        self._drop(min(1, len(self._buf)))

    def _decode_at(self, start: int, hlen: int, plen: int) -> Frame:
        buf = self._buf
        hstart = start + PREFIX_SIZE
        with memoryview(buf) as mv:
            header = parse_header(bytes(mv[hstart : hstart + hlen]))
            payload = bytes(mv[hstart + hlen : hstart + hlen + plen])
        return Frame(header, payload, hlen)

    def next_frame(self) -> Frame | None:
        buf = self._buf
        if len(buf) < PREFIX_SIZE:
            if buf and not MAGIC.startswith(bytes(buf[:2])):
                raise ProtocolError(f"bad magic {bytes(buf[:2])!r}")
            return None
        hlen, plen = parse_prefix(buf[:PREFIX_SIZE])
        total = PREFIX_SIZE + hlen + plen
        if len(buf) < total:
            return None
        f = self._decode_at(0, hlen, plen)
        del buf[:total]
        return f

    def scan(
        self,
        accept: Callable[[Frame], bool],
        *,
        max_header: int = HELLO_MAX_HEADER,
        max_payload: int = 0,
    ) -> Frame | None:
        """Resync: find the first complete frame that ``accept`` takes.

        Only candidates whose header is at most ``max_header`` and payload at most
        ``max_payload`` bytes are considered, so a bogus length in garbage cannot make
        the scanner wait for megabytes. Everything before the accepted frame is dropped
        (as is every byte that cannot start a candidate). Returns None if more bytes
        are needed.
        """
        buf = self._buf
        i = 0
        first_incomplete = -1
        while True:
            j = buf.find(MAGIC, i)
            if j < 0:
                break
            if len(buf) - j < PREFIX_SIZE:
                if first_incomplete < 0:
                    first_incomplete = j
                break
            try:
                hlen, plen = parse_prefix(buf[j : j + PREFIX_SIZE])
            except ProtocolError:
                i = j + 1
                continue
            if hlen > max_header or plen > max_payload:
                i = j + 1
                continue
            end = j + PREFIX_SIZE + hlen + plen
            if len(buf) < end:
                if first_incomplete < 0:
                    first_incomplete = j
                i = j + 1
                continue
            try:
                f = self._decode_at(j, hlen, plen)
            except ProtocolError:
                i = j + 1
                continue
            if accept(f):
                self._drop(end)
                return f
            i = j + 1
        if first_incomplete >= 0:
            self._drop(first_incomplete)
        elif buf.endswith(MAGIC[:1]):
            self._drop(len(buf) - 1)
        else:
            self._drop(len(buf))
        return None
