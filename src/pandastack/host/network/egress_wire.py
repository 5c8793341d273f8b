"""The name a guest's connection is for, read from bytes the guest controls.

Everything here parses hostile input: lengths are checked before they are used, reads are
bounded, and anything this parser and a real server could read differently (duplicate
extensions or Host headers, bare LF, folded headers, both Content-Length and chunked, an
absolute URI naming another host) is refused rather than guessed at. A refusal raises
`Refused`; the proxy then closes the connection without sending anything upstream.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from dataclasses import dataclass

from pandastack.hostport.network import normalize_name

# One TLS record carries at most 2^14 plaintext bytes; a ClientHello spread over several
# records is reassembled up to this size (large post-quantum key shares are ~2 KiB).
MAX_RECORD = 1 << 14
MAX_HELLO = 1 << 14
# An HTTP request head (request line, headers, blank line); also a chunk-size or trailer line.
MAX_HEAD = 1 << 14
MAX_CONTENT_LENGTH = 1 << 53

TLS_HANDSHAKE = 0x16
CLIENT_HELLO = 1
EXT_SERVER_NAME = 0
# Encrypted ClientHello: the real name is inside, encrypted for the server. A CDN's
# client-facing server would route it to any site it fronts, whatever the outer SNI says.
EXT_ENCRYPTED_CLIENT_HELLO = 0xFE0D

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_METHOD = re.compile(rb"[A-Z]{1,20}")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PORT = re.compile(r"[0-9]{1,5}")
_CHUNK_LINE = re.compile(rb"([0-9a-fA-F]{1,15})(;[\x20-\x7e\t]*)?\r\n")


class Refused(Exception):
    """The connection is closed unforwarded; the message is for the log."""


# -- names ----------------------------------------------------------------------------------

def domain_matches(entry: str, name: str) -> bool:
    """`entry` from parse_domain_entry, `name` from normalize_name."""
    if entry.startswith("*."):
        return name.endswith(entry[1:])
    if entry.startswith("."):
        return name == entry[1:] or name.endswith(entry)
    return name == entry


def ipv4_literal(value: str) -> str | None:
    """A dotted-quad IPv4 address in canonical form, or None."""
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        return None


# -- TLS ------------------------------------------------------------------------------------

class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise Refused("truncated ClientHello")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int) -> bytes:
        return self.take(self.uint(size))

    def done(self) -> bool:
        return self.pos == len(self.data)


def parse_client_hello(message: bytes) -> str | None:
    """The SNI host name of a whole ClientHello handshake message (type and length included),
    or None when it has none."""
    top = _Cursor(message)
    if top.uint(1) != CLIENT_HELLO or top.uint(3) != len(message) - 4:
        raise Refused("not a ClientHello")
    hello = _Cursor(top.take(len(message) - 4))
    if hello.take(1) != b"\x03":
        raise Refused("unknown TLS version")
    hello.take(1 + 32)  # minor version, random
    if len(hello.vector(1)) > 32:
        raise Refused("session id too long")
    suites = hello.vector(2)
    if not suites or len(suites) % 2:
        raise Refused("bad cipher suites")
    if not hello.vector(1):
        raise Refused("no compression methods")
    if hello.done():
        return None
    extensions = _Cursor(hello.vector(2))
    if not hello.done():
        raise Refused("bytes after the extensions")
    seen: set[int] = set()
    name = None
    while not extensions.done():
        kind, data = extensions.uint(2), extensions.vector(2)
        if kind in seen:
            raise Refused(f"duplicate TLS extension {kind}")
        seen.add(kind)
        if kind == EXT_ENCRYPTED_CLIENT_HELLO:
            raise Refused("encrypted ClientHello")
        if kind == EXT_SERVER_NAME:
            name = _server_name(data)
    return name


def _server_name(data: bytes) -> str:
    outer = _Cursor(data)
    names = _Cursor(outer.vector(2))
    if not outer.done():
        raise Refused("bytes after the server name list")
    if names.uint(1) != 0:  # host_name: the only type defined
        raise Refused("unknown server name type")
    raw = names.vector(2)
    if not names.done():
        raise Refused("more than one server name")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise Refused("server name is not ASCII") from None
    name = normalize_name(text)
    if name is None or text.endswith("."):
        raise Refused(f"bad server name {text[:80]!r}")
    return name


async def read_client_hello(reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
    """Read the guest's first TLS records up to the end of its ClientHello. Returns the raw
    bytes read (to forward unchanged) and the SNI name (None when there is none)."""
    raw = bytearray()
    message = bytearray()
    needed: int | None = None
    while needed is None or len(message) < needed:
        header = await _exactly(reader, 5)
        length = int.from_bytes(header[3:5], "big")
        if header[0] != TLS_HANDSHAKE or header[1] != 3:
            raise Refused("not a TLS handshake")
        if not 0 < length <= MAX_RECORD:
            raise Refused("bad TLS record length")
        body = await _exactly(reader, length)
        raw += header + body
        message += body
        if needed is None and len(message) >= 4:
            needed = 4 + int.from_bytes(message[1:4], "big")
            if message[0] != CLIENT_HELLO or needed > MAX_HELLO:
                raise Refused("not a ClientHello, or too long")
    if len(message) != needed:
        raise Refused("more handshake data after the ClientHello")
    return bytes(raw), parse_client_hello(bytes(message))


async def _exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError:
        raise Refused("closed mid-handshake") from None


# -- HTTP -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestHead:
    """What the proxy needs of one HTTP/1.x request head. `host` is a normalized name or an
    IPv4 literal; the body is `content_length` bytes, or chunked; `upgrade`: to WebSocket."""

    method: str
    host: str
    content_length: int = 0
    chunked: bool = False
    upgrade: bool = False


async def read_request_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next request head, separator included, or None on a clean end (EOF between
    requests). The reader's limit bounds it (the proxy's readers use MAX_HEAD)."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise Refused("closed mid request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise Refused("request head too long") from None


def parse_request_head(head: bytes) -> RequestHead:
    if len(head) > MAX_HEAD or not head.endswith(b"\r\n\r\n"):
        raise Refused("request head too long or unterminated")
    lines = head[:-4].split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise Refused("bare CR or LF in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise Refused("bad request line")
    method, target, version = parts
    if not _METHOD.fullmatch(method) or method in (b"CONNECT", b"PRI"):
        raise Refused(f"method {method[:20]!r} refused")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or not _TARGET.fullmatch(target):
        raise Refused("bad request line")
    fields: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name) or _VALUE_BAD.search(value):
            raise Refused("bad header line")
        fields.setdefault(name.lower(), []).append(value.strip(b" \t"))
    hosts = fields.get(b"host", [])
    if len(hosts) != 1:
        raise Refused("no Host header, or more than one")
    host = _authority_host(hosts[0])
    if target.startswith(b"/") or (target == b"*" and method == b"OPTIONS"):
        pass
    elif target[:7].lower() == b"http://":
        # A server takes an absolute URI's host over the Host header: they must agree.
        authority = target[7:].split(b"/", 1)[0].split(b"?", 1)[0]
        if _authority_host(authority) != host:
            raise Refused("request URI names another host than Host")
    else:
        raise Refused("bad request target")
    # Only a WebSocket upgrade may turn the connection into raw bytes: after any other
    # (h2c above all: HTTP/2 names a host per stream), the guest's bytes are still parsed as
    # HTTP/1.x requests, so a switched protocol gets no further than its first bytes.
    upgrade = [v.lower() for v in fields.get(b"upgrade", [])] == [b"websocket"]
    return RequestHead(method.decode(), host, *_body(fields, version), upgrade=upgrade)


def _authority_host(value: bytes) -> str:
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise Refused("Host is not ASCII") from None
    host, sep, port = text.rpartition(":") if ":" in text else (text, "", "")
    if sep and not (_PORT.fullmatch(port) and int(port) <= 65535):
        raise Refused(f"bad Host {text[:80]!r}")
    name = ipv4_literal(host) or (None if host.endswith(".") else normalize_name(host))
    if name is None or "@" in text:
        raise Refused(f"bad Host {text[:80]!r}")
    return name


def _body(fields: dict[bytes, list[bytes]], version: bytes) -> tuple[int, bool]:
    encodings = fields.get(b"transfer-encoding", [])
    lengths = fields.get(b"content-length", [])
    if encodings:
        # Anything but exactly one "chunked" is framed differently by different servers.
        if lengths or len(encodings) != 1 or encodings[0].lower() != b"chunked" \
                or version != b"HTTP/1.1":
            raise Refused("unsupported Transfer-Encoding")
        return 0, True
    if not lengths:
        return 0, False
    if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 16 \
            or int(lengths[0]) > MAX_CONTENT_LENGTH:
        raise Refused("bad Content-Length")
    return int(lengths[0]), False


def trailer_ends(line: bytes) -> bool:
    """Whether a chunked body's trailer line (CRLF included) is the blank one that ends it;
    any other line must be a well-formed header field."""
    if line == b"\r\n":
        return True
    name, sep, value = line[:-2].partition(b":")
    if not line.endswith(b"\r\n") or not sep or not _TOKEN.fullmatch(name) \
            or _VALUE_BAD.search(value):
        raise Refused("bad trailer line")
    return False


def parse_chunk_line(line: bytes) -> int:
    """The size announced by a chunk-size line (CRLF included)."""
    match = _CHUNK_LINE.fullmatch(line)
    if match is None:
        raise Refused("bad chunk size line")
    return int(match.group(1), 16)
