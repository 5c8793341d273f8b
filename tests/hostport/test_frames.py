"""The host API's stream framing (hostport/frames.py): round trips in any split of the
bytes, and a clear FrameError for every violation."""

from __future__ import annotations

import pytest

from pandastack.hostport.frames import (
    CHUNK,
    HEADER,
    MAX_PAYLOAD,
    Decoder,
    Frame,
    FrameError,
    Kind,
    encode,
    encode_chunks,
)


def stream() -> tuple[bytes, list[Frame]]:
    frames = [Frame(Kind.STDOUT, b"out"), Frame(Kind.STDERR, b""),
              Frame(Kind.DATA, bytes(range(256)) * 300), Frame(Kind.EVENT, b'{"type":"end"}'),
              Frame(Kind.LOG, "Step 1/2 RUN \u00e9".encode()), Frame(Kind.RESULT, b"{}")]
    return b"".join(encode(f.kind, f.payload) for f in frames), frames


@pytest.mark.parametrize("piece", [1, 2, 5, 4096, 1 << 20])
def test_round_trip_in_any_split(piece: int) -> None:
    data, frames = stream()
    decoder = Decoder()
    got: list[Frame] = []
    for start in range(0, len(data), piece):
        got += decoder.feed(data[start:start + piece])
    decoder.end()
    assert got == frames
    assert decoder.finished and got[-1].final


def test_chunks_are_bounded_and_join_back() -> None:
    data = bytes(CHUNK * 2 + 7)
    frames = Decoder().feed(b"".join(encode_chunks(Kind.DATA, data)))
    assert [len(f.payload) for f in frames] == [CHUNK, CHUNK, 7]
    assert b"".join(f.payload for f in frames) == data
    assert list(encode_chunks(Kind.DATA, b"")) == []


def test_unknown_type() -> None:
    with pytest.raises(FrameError, match="unknown frame type 0x63"):
        Decoder().feed(HEADER.pack(0x63, 0))


def test_oversized_frame_is_refused_from_its_header() -> None:
    decoder = Decoder(max_payload=1024)
    with pytest.raises(FrameError, match="announces 1025 bytes"):
        decoder.feed(HEADER.pack(Kind.DATA, 1025))  # refused before any payload arrives
    with pytest.raises(FrameError, match="over the"):
        encode(Kind.DATA, bytes(MAX_PAYLOAD + 1))


def test_nothing_after_the_final_frame() -> None:
    with pytest.raises(FrameError, match="after the final frame"):
        Decoder().feed(encode(Kind.ERROR, b"{}") + encode(Kind.STDOUT, b"x"))
    decoder = Decoder()
    decoder.feed(encode(Kind.RESULT, b"{}"))
    with pytest.raises(FrameError, match="after the final frame"):
        decoder.feed(b"\x01")


def test_end_inside_a_frame() -> None:
    decoder = Decoder()
    assert decoder.feed(encode(Kind.STDOUT, b"hello")[:-2]) == []
    with pytest.raises(FrameError, match="ended inside a frame"):
        decoder.end()
    unfinished = Decoder()
    unfinished.feed(encode(Kind.STDOUT, b"x"))
    unfinished.end()  # a clean end without the final frame is for the reader to judge
    assert not unfinished.finished
