"""Unit tests of the frame codec (pandastack.guestproto.frames)."""

from __future__ import annotations

import json
import struct

import pytest

from pandastack.guestproto import frames as P


def raw(hlen: int, plen: int, *, magic: bytes = b"PS", version: int = 1, flags: int = 0) -> bytes:
    return struct.pack(">2sBBII", magic, version, flags, hlen, plen)


def test_layout_is_exact() -> None:
    data = P.encode({"t": "ping", "id": 7}, b"xyz")
    header = b'{"t":"ping","id":7}'
    assert data == b"PS\x01\x00" + struct.pack(">II", len(header), 3) + header + b"xyz"
    assert P.PREFIX_SIZE == 12


def test_roundtrip_and_incremental_feed() -> None:
    frames = [
        P.frame("exec", 1, cmd="echo hi", env={"A": "ü"}),
        P.frame("stdin", 1, b"\x00\xff" * 1000),
        P.frame("ping", 2),
    ]
    stream = b"".join(frames)
    dec = P.FrameDecoder()
    got: list[P.Frame] = []
    for i in range(len(stream)):  # one byte at a time
        dec.feed(stream[i : i + 1])
        while (f := dec.next_frame()) is not None:
            got.append(f)
    assert [f.t for f in got] == ["exec", "stdin", "ping"]
    assert got[0].header["env"] == {"A": "ü"}
    assert got[1].payload == b"\x00\xff" * 1000
    assert got[2].id == 2
    assert len(dec) == 0


def test_max_sizes_accepted() -> None:
    payload = bytes(P.MAX_PAYLOAD)
    dec = P.FrameDecoder()
    dec.feed(P.frame("data", 3, payload))
    f = dec.next_frame()
    assert f is not None and len(f.payload) == P.MAX_PAYLOAD


def test_encode_limits() -> None:
    with pytest.raises(P.ProtocolError):
        P.frame("data", 1, bytes(P.MAX_PAYLOAD + 1))
    with pytest.raises(P.ProtocolError):
        P.frame("x", 1, big="a" * P.MAX_HEADER)
    with pytest.raises(P.ProtocolError):
        P.encode({"t": "x"})
    with pytest.raises(P.ProtocolError):
        P.encode({"t": "x", "id": True})
    with pytest.raises(P.ProtocolError):
        P.encode({"t": "", "id": 1})
    with pytest.raises(P.ProtocolError):
        P.encode({"t": "x", "id": -1})


@pytest.mark.parametrize(
    "prefix",
    [
        raw(10, 0, magic=b"XX"),
        raw(10, 0, version=2),
        raw(10, 0, flags=1),
        raw(0, 0),
        raw(P.MAX_HEADER + 1, 0),
        raw(10, P.MAX_PAYLOAD + 1),
        raw(0xFFFFFFFF, 0xFFFFFFFF),
    ],
)
def test_bad_prefix_rejected_before_the_body_arrives(prefix: bytes) -> None:
    dec = P.FrameDecoder()
    dec.feed(prefix)  # only the 12 bytes: an oversized length must not make it wait
    with pytest.raises(P.ProtocolError):
        dec.next_frame()


def test_bad_magic_detected_early() -> None:
    dec = P.FrameDecoder()
    dec.feed(b"GET ")
    with pytest.raises(P.ProtocolError):
        dec.next_frame()
    dec = P.FrameDecoder()
    dec.feed(b"P")
    assert dec.next_frame() is None


@pytest.mark.parametrize(
    "header",
    [
        b"not json",
        b"\xff\xfe",
        b"[1,2]",
        b'{"id":1}',
        b'{"t":"x"}',
        b'{"t":5,"id":1}',
        b'{"t":"x","id":true}',
        b'{"t":"x","id":1.5}',
        b'{"t":"x","id":-3}',
    ],
)
def test_bad_header_rejected(header: bytes) -> None:
    dec = P.FrameDecoder()
    dec.feed(raw(len(header), 0) + header)
    with pytest.raises(P.ProtocolError):
        dec.next_frame()


def hello(nonce: str) -> bytes:
    return P.frame("hello", 0, v=1, nonce=nonce)


def is_hello(f: P.Frame) -> bool:
    return f.t == "hello"


def test_scan_skips_garbage_and_other_frames() -> None:
    dec = P.FrameDecoder()
    dec.feed(b"\x00garbage PS PS\x01" + P.frame("ping", 0) + P.frame("data", 4, b"PS") + hello("n"))
    f = dec.scan(is_hello)
    assert f is not None and f.header["nonce"] == "n"
    assert len(dec) == 0
    assert dec.discarded > 0


def test_scan_ignores_candidates_with_payload_or_big_header() -> None:
    dec = P.FrameDecoder()
    dec.feed(P.frame("hello", 0, b"x", v=1) + P.frame("hello", 0, pad="a" * 5000))
    assert dec.scan(is_hello) is None


def test_scan_is_not_stuck_behind_a_bogus_length() -> None:
    # A "PS" in garbage that claims a 4000-byte header must not hide a hello after it.
    dec = P.FrameDecoder()
    dec.feed(raw(4000, 0) + b"junk" + hello("a"))
    f = dec.scan(is_hello)
    assert f is not None and f.header["nonce"] == "a"


def test_scan_keeps_a_partial_candidate() -> None:
    data = hello("zz")
    dec = P.FrameDecoder()
    dec.feed(b"xxxxx" + data[:7])
    assert dec.scan(is_hello) is None
    assert len(dec) == 7
    dec.feed(data[7:])
    f = dec.scan(is_hello)
    assert f is not None and f.header["nonce"] == "zz"


def test_scan_keeps_trailing_p() -> None:
    dec = P.FrameDecoder()
    dec.feed(b"abcP")
    assert dec.scan(is_hello) is None
    assert len(dec) == 1
    dec.feed(hello("q")[1:])
    assert dec.scan(is_hello) is not None


def test_skip_bad_then_scan_finds_following_hello() -> None:
    dec = P.FrameDecoder()
    bad = b"PS\x01\x00" + struct.pack(">II", 3, 0) + b"{{{"
    dec.feed(bad + hello("h"))
    with pytest.raises(P.ProtocolError):
        dec.next_frame()
    dec.skip_bad()
    f = dec.scan(is_hello)
    assert f is not None and json.dumps(f.header["nonce"]) == '"h"'


def test_deeply_nested_header_is_a_protocol_error() -> None:
    """json.loads raises RecursionError on deep nesting; the decoder turns it into the
    ProtocolError its callers handle (a guest could otherwise kill the host's reader)."""
    header = b'{"t":"pong","id":1,"x":' + b"[" * 5000 + b"]" * 5000 + b"}"
    dec = P.FrameDecoder()
    dec.feed(raw(len(header), 0) + header)
    with pytest.raises(P.ProtocolError, match="nested"):
        dec.next_frame()
    small = b'{"t":"hello","id":0,"x":' + b"[" * 2000 + b"]" * 2000 + b"}"
    dec = P.FrameDecoder()
    dec.feed(raw(len(small), 0) + small + P.frame("hello", 0, nonce="n"))
    f = dec.scan(lambda fr: fr.t == "hello")  # a resync skips it like garbage
    assert f is not None and f.header["nonce"] == "n"


def test_parse_json_of_the_peer() -> None:
    assert P.parse_json(b'[{"a": 1}]') == [{"a": 1}]
    for bad in (b"[" * 100_000, b"{", b"\xff"):
        with pytest.raises(ValueError):
            P.parse_json(bad)


def test_frames_know_their_header_size() -> None:
    data = P.frame("pong", 3, b"xy", pad="z" * 100)
    dec = P.FrameDecoder()
    dec.feed(data)
    f = dec.next_frame()
    assert f is not None and f.header_size == len(data) - P.PREFIX_SIZE - 2
