"""sbx.filesystem (sync): query building, raw bodies, streamed upload and download."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pandastack import APIConnectionError, InvalidRequestError, NotFoundError, Sandbox
from pandastack.sdk._base import UPLOAD_CHUNK_SIZE
from tests.sdk.fakes import (
    API_KEY,
    API_URL,
    FILE_ENTRY,
    ChunkRecordingTransport,
    FakeAPI,
    body,
    envelope,
    reply,
    stream_reply,
)

FILES = "/v1/sandboxes/sb-1/files"


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI().with_sandbox()


@pytest.fixture
def sbx(api: FakeAPI) -> Iterator[Sandbox]:
    with Sandbox.create(api_url=API_URL, api_key=API_KEY, transport=api.transport) as sandbox:
        yield sandbox


def test_write_str_and_bytes(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("PUT", FILES, reply(200, {"path": "/work/a.py", "size": 6}))
    assert sbx.filesystem.write("/work/a.py", "print(1) ✓").size == 6
    request = api.last("PUT", FILES)
    assert request.url.params["path"] == "/work/a.py" and "mode" not in request.url.params
    assert request.content == "print(1) ✓".encode()
    assert request.headers["content-type"] == "application/octet-stream"
    sbx.filesystem.write("/work/run.sh", b"\x00\xff", mode=0o755)
    request = api.last("PUT", FILES)
    assert request.content == b"\x00\xff" and request.url.params["mode"] == "755"


def test_read_returns_bytes(api: FakeAPI, sbx: Sandbox) -> None:
    api.on(
        "GET", FILES, stream_reply([b"a,b\n", b"1,2\n"], content_type="application/octet-stream")
    )
    assert sbx.filesystem.read("/work/report.csv") == b"a,b\n1,2\n"
    assert api.last("GET", FILES).url.params["path"] == "/work/report.csv"


def test_read_missing_file(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("GET", FILES, reply(404, envelope("not_found", "no such file", "r-5")))
    with pytest.raises(NotFoundError) as info:
        sbx.filesystem.read("/nope")
    assert info.value.request_id == "r-5"


def test_list_stat_exists(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("GET", f"{FILES}/list", reply(200, {"entries": [FILE_ENTRY]}))
    api.on("GET", f"{FILES}/stat", reply(200, FILE_ENTRY))
    [entry] = sbx.filesystem.list("/work")
    assert (entry.name, entry.type, entry.size) == ("a.txt", "file", 3)
    assert api.last("GET", f"{FILES}/list").url.params["path"] == "/work"
    assert sbx.filesystem.stat("/work/a.txt").mode == 0o644
    assert sbx.filesystem.exists("/work/a.txt")
    api.on("GET", f"{FILES}/stat", reply(404, envelope("not_found", "no such file")))
    assert not sbx.filesystem.exists("/work/b.txt")
    assert api.last("GET", f"{FILES}/stat").url.params["path"] == "/work/b.txt"


def test_mkdir_remove_rename(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", f"{FILES}/mkdir", reply(204)).on("DELETE", FILES, reply(204))
    api.on("POST", f"{FILES}/rename", reply(204))
    sbx.filesystem.mkdir("/work/out")
    assert body(api.last("POST", f"{FILES}/mkdir")) == {"path": "/work/out", "parents": True}
    sbx.filesystem.remove("/work/out")
    assert dict(api.last("DELETE", FILES).url.params) == {"path": "/work/out", "recursive": "false"}
    sbx.filesystem.remove("/work", recursive=True)
    assert api.last("DELETE", FILES).url.params["recursive"] == "true"
    sbx.filesystem.rename("/work/a", "/work/b")
    assert body(api.last("POST", f"{FILES}/rename")) == {"src": "/work/a", "dst": "/work/b"}


def test_grep_and_glob(api: FakeAPI, sbx: Sandbox) -> None:
    found = {"matches": [{"path": "/w/a.py", "line": 3, "text": "x = 1"}], "truncated": True}
    api.on("POST", f"{FILES}/grep", reply(200, found))
    api.on("POST", f"{FILES}/glob", reply(200, {"paths": ["/w/a.py"], "truncated": False}))
    got = sbx.files.grep("/w", "x =")
    assert (got.matches[0].line, got.matches[0].text, got.truncated) == (3, "x = 1", True)
    assert body(api.last("POST", f"{FILES}/grep")) == {"path": "/w", "pattern": "x =",
                                                       "ignore_case": False}
    sbx.files.grep("/w", "X", ignore_case=True)
    assert body(api.last("POST", f"{FILES}/grep"))["ignore_case"] is True
    assert sbx.files.glob("/w", "**/*.py").paths == ["/w/a.py"]
    assert body(api.last("POST", f"{FILES}/glob")) == {"path": "/w", "pattern": "**/*.py"}
    sent = len(api.requests)
    for bad in (lambda: sbx.files.grep("/w", "x" * 1025), lambda: sbx.files.grep("w", "x"),
                lambda: sbx.files.grep("/w", "a\nb"), lambda: sbx.files.glob("/w", "../*")):
        with pytest.raises(InvalidRequestError):
            bad()
    assert len(api.requests) == sent  # refused before sending


def test_upload_streams_from_disk(tmp_path: Path) -> None:
    api = FakeAPI().with_sandbox().on("PUT", FILES, reply(200, {"path": "/data.bin", "size": 0}))
    transport = ChunkRecordingTransport(api)
    data = os.urandom(3 * UPLOAD_CHUNK_SIZE + 17)
    local = tmp_path / "data.bin"
    local.write_bytes(data)
    with Sandbox.create(api_url=API_URL, api_key=API_KEY, transport=transport) as sbx:
        sbx.filesystem.upload(local, "/data.bin", mode=0o600)
    request = api.last("PUT", FILES)
    chunks = transport.chunks[("PUT", FILES)]
    assert len(chunks) == 4  # sent chunk by chunk, never as one buffer
    assert max(len(c) for c in chunks) <= UPLOAD_CHUNK_SIZE
    assert request.content == data
    assert request.headers["content-length"] == str(len(data))
    assert "transfer-encoding" not in request.headers
    assert dict(request.url.params) == {"path": "/data.bin", "mode": "600"}


def test_download_streams_to_disk(api: FakeAPI, sbx: Sandbox, tmp_path: Path) -> None:
    dst = tmp_path / "report.csv"
    seen_partial: list[bool] = []

    def chunks() -> Iterator[bytes]:
        yield b"x" * 1000
        # The first chunk is on disk (in a temp file) before the body has finished.
        seen_partial.append(any(p.name.endswith(".part") for p in tmp_path.iterdir()))
        assert not dst.exists()
        yield b"y" * 500

    api.on("GET", FILES, lambda r: httpx.Response(200, content=chunks()))
    assert sbx.filesystem.download("/work/report.csv", dst) == 1500
    assert dst.read_bytes() == b"x" * 1000 + b"y" * 500
    assert seen_partial == [True]
    assert [p.name for p in tmp_path.iterdir()] == ["report.csv"]


def test_failed_download_leaves_nothing(api: FakeAPI, sbx: Sandbox, tmp_path: Path) -> None:
    dst = tmp_path / "out.bin"
    api.on("GET", FILES, reply(404, envelope("not_found", "no such file")))
    with pytest.raises(NotFoundError):
        sbx.filesystem.download("/nope", dst)

    def broken() -> Iterator[bytes]:
        yield b"partial"
        raise httpx.ReadError("reset")

    api.on("GET", FILES, lambda r: httpx.Response(200, content=broken()))
    with pytest.raises(APIConnectionError):
        sbx.filesystem.download("/big", dst)
    assert list(tmp_path.iterdir()) == []


class _Chunks(httpx.SyncByteStream):
    """A response body that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield from (b"a" * 10, b"b" * 10, b"c" * 10)

    def close(self) -> None:
        self.closed = True


def test_a_stream_dropped_half_read_is_closed_at_once_not_by_the_gc(
        api: FakeAPI, sbx: Sandbox) -> None:
    """A stream left half read used to stay open until the cyclic GC found it, which could
    run inside httpcore's pool lock and deadlock the client on closing it."""
    import gc

    chunks = _Chunks()
    api.on("GET", FILES, lambda request: httpx.Response(200, stream=chunks))
    gc.disable()
    try:
        for chunk in sbx.files.read("/big", format="stream"):
            assert chunk
            break
        assert chunks.closed, "closed only once the cyclic GC runs"
    finally:
        gc.enable()
