"""The async twins against the same fake API: same requests, same results, same errors."""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import pandastack
from pandastack import (
    APIConnectionError,
    AsyncClient,
    AsyncSandbox,
    ConfigError,
    InvalidRequestError,
    NotFoundError,
)
from pandastack.sdk._base import EXEC_TIMEOUT_MARGIN, UPLOAD_CHUNK_SIZE
from tests.sdk.fakes import (
    API_KEY,
    API_URL,
    FILE_ENTRY,
    LIFECYCLE,
    SANDBOX,
    ChunkRecordingTransport,
    FakeAPI,
    astream_reply,
    body,
    envelope,
    exec_result,
    pieces,
    reply,
    sse,
)

SB = "/v1/sandboxes/sb-1"


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI().with_sandbox()


async def create(api: FakeAPI | ChunkRecordingTransport,
                 ttl_seconds: int | None = None) -> AsyncSandbox:
    transport = api.transport if isinstance(api, FakeAPI) else api
    return await AsyncSandbox.create(
        api_url=API_URL, api_key=API_KEY, transport=transport, ttl_seconds=ttl_seconds)


async def test_async_with_await_create_kills_on_exit(api: FakeAPI) -> None:
    async with await create(api, ttl_seconds=900) as sbx:
        assert sbx.id == "sb-1"
        assert body(api.last("POST", "/v1/sandboxes")) == {
            "template": "base",
            "ttl_seconds": 900,
            "persistent": False,
        }
    assert len(api.calls("DELETE", SB)) == 1


async def test_kills_on_exception_and_reraises(api: FakeAPI) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with await create(api):
            raise RuntimeError("boom")
    assert len(api.calls("DELETE", SB)) == 1


async def test_kills_on_cancellation(api: FakeAPI) -> None:
    async def body_of_work() -> None:
        async with await create(api):
            await asyncio.sleep(10)

    task = asyncio.ensure_future(body_of_work())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(api.calls("DELETE", SB)) == 1


async def test_connect_list_refresh_lifecycle_logs(api: FakeAPI) -> None:
    (
        api.on("GET", "/v1/sandboxes", reply(200, {"sandboxes": [SANDBOX]}))
        .on("GET", f"{SB}/lifecycle", reply(200, LIFECYCLE))
        .on("PATCH", f"{SB}/lifecycle", reply(200, {**LIFECYCLE, "persistent": True}))
        .on("GET", f"{SB}/logs", reply(200, {"console": "c", "agent": "a"}))
    )
    infos = await AsyncSandbox.list(
        state="running",
        metadata={"k": "v"},
        api_url=API_URL,
        api_key=API_KEY,
        transport=api.transport,
    )
    assert [i.id for i in infos] == ["sb-1"]
    assert dict(api.last("GET", "/v1/sandboxes").url.params) == {
        "state": "running",
        "metadata.k": "v",
    }
    sbx = await AsyncSandbox.connect(
        "sb-1", api_url=API_URL, api_key=API_KEY, transport=api.transport
    )
    assert (await sbx.refresh()).id == "sb-1"
    assert (await sbx.lifecycle()).ttl_seconds == 900
    assert (await sbx.set_persistent(True)).persistent
    assert body(api.last("PATCH", f"{SB}/lifecycle")) == {"persistent": True}
    await sbx.set_ttl(30)
    assert body(api.last("PATCH", f"{SB}/lifecycle")) == {"ttl_seconds": 30}
    assert (await sbx.logs()).agent == "a"
    await sbx.kill()
    await sbx.kill()
    assert len(api.calls("DELETE", SB)) == 1
    await sbx.close()


async def test_exec_and_its_read_timeout(api: FakeAPI) -> None:
    api.on("POST", f"{SB}/exec", reply(200, exec_result(stdout="ok")))
    async with await create(api) as sbx:
        result = await sbx.exec("pip install pandas pyarrow", timeout_seconds=300)
        assert result.stdout == "ok"
        assert (await sbx.commands.run("true")).exit_code == 0
        with pytest.raises(InvalidRequestError):
            await sbx.exec("")
    first = api.calls("POST", f"{SB}/exec")[0]
    timeout = first.extensions["timeout"]
    assert timeout["read"] >= 300 + EXEC_TIMEOUT_MARGIN


async def test_streaming_exec_with_sync_and_async_callbacks(api: FakeAPI) -> None:
    events = sse(
        ("stdout", {"data": "日"}),
        ("stderr", {"data": "本"}),
        ("stdout", {"data": "語"}),
        ("exit", exec_result(exit_code=7)),
    )
    api.on("POST", f"{SB}/exec/stream", astream_reply(pieces(events, 5)))
    out: list[str] = []
    err: list[str] = []

    async def on_stderr(text: str) -> None:
        await asyncio.sleep(0)
        err.append(text)

    async with await create(api) as sbx:
        result = await sbx.exec("x", timeout_seconds=600, on_stdout=out.append, on_stderr=on_stderr)
    assert out == ["日", "語"] and err == ["本"]
    assert (result.exit_code, result.stdout, result.stderr) == (7, "日語", "本")
    assert api.last("POST", f"{SB}/exec/stream").extensions["timeout"]["read"] > 600


async def test_streaming_error_event(api: FakeAPI) -> None:
    api.on(
        "POST",
        f"{SB}/exec/stream",
        astream_reply([sse(("error", envelope("not_found", "sandbox gone", "r-async")))]),
    )
    async with await create(api) as sbx:
        with pytest.raises(NotFoundError) as info:
            await sbx.exec("x", on_stdout=print)
    assert info.value.request_id == "r-async"


async def test_processes(api: FakeAPI) -> None:
    procs = f"{SB}/processes"
    info = {"pid": 7, "cmd": ["sleep", "100"], "running": True}
    (
        api.on("POST", procs, reply(201, info))
        .on("GET", procs, reply(200, {"processes": [info]}))
        .on("POST", f"{procs}/7/stdin", reply(204))
        .on("POST", f"{procs}/7/signal", reply(204))
        .on("POST", f"{procs}/7/wait", reply(200, exec_result(exit_code=0)))
    )
    async with await create(api) as sbx:
        proc = await sbx.commands.start(["sleep", "100"])
        assert proc.pid == 7
        assert [p.pid for p in await sbx.commands.list()] == [7]
        await proc.send_stdin("data", eof=True)
        assert api.last("POST", f"{procs}/7/stdin").url.params["eof"] == "true"
        await proc.kill()
        assert body(api.last("POST", f"{procs}/7/signal")) == {"signal": 9}
        assert (await proc.wait(timeout_seconds=5)).exit_code == 0
        assert api.last("POST", f"{procs}/7/wait").extensions["timeout"]["read"] > 5


async def test_filesystem(api: FakeAPI) -> None:
    files = f"{SB}/files"
    (
        api.on("PUT", files, reply(200, {"path": "/a", "size": 2}))
        .on("GET", files, astream_reply([b"ab", b"cd"], content_type="application/octet-stream"))
        .on("GET", f"{files}/list", reply(200, {"entries": [FILE_ENTRY]}))
        .on("GET", f"{files}/stat", reply(404, envelope("not_found", "no")))
        .on("POST", f"{files}/mkdir", reply(204))
        .on("DELETE", files, reply(204))
        .on("POST", f"{files}/rename", reply(204))
    )
    async with await create(api) as sbx:
        fs = sbx.filesystem
        assert (await fs.write("/a", "hi")).size == 2
        assert api.last("PUT", files).content == b"hi"
        assert await fs.read("/a") == b"abcd"
        assert [e.name for e in await fs.list("/work")] == ["a.txt"]
        assert not await fs.exists("/missing")
        await fs.mkdir("/d", parents=False)
        assert body(api.last("POST", f"{files}/mkdir")) == {"path": "/d", "parents": False}
        await fs.remove("/d", recursive=True)
        assert api.last("DELETE", files).url.params["recursive"] == "true"
        await fs.rename("/a", "/b")


async def test_upload_and_download_stream(tmp_path: Path) -> None:
    files = f"{SB}/files"
    data = os.urandom(2 * UPLOAD_CHUNK_SIZE + 1)

    async def body_chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 4096):
            yield data[i : i + 4096]

    api = (
        FakeAPI()
        .with_sandbox()
        .on("PUT", files, reply(200, {"path": "/d", "size": 0}))
        .on("GET", files, lambda r: httpx.Response(200, content=body_chunks()))
    )
    transport = ChunkRecordingTransport(api)
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    src.write_bytes(data)
    async with await create(transport) as sbx:
        await sbx.filesystem.upload(src, "/d")
        assert await sbx.filesystem.download("/d", dst) == len(data)
    assert len(transport.chunks[("PUT", files)]) == 3
    put = api.last("PUT", files)
    assert put.content == data and put.headers["content-length"] == str(len(data))
    assert dst.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst.bin", "src.bin"]


async def test_async_client(api: FakeAPI) -> None:
    api.on("GET", "/v1/keys", reply(200, {"keys": []}))
    async with AsyncClient(API_URL, API_KEY, transport=api.transport) as client:
        sbx = await client.sandboxes.create(template="base", metadata={"a": "b"})
        assert body(api.last("POST", "/v1/sandboxes"))["metadata"] == {"a": "b"}
        assert (await client.sandboxes.get("sb-1")).state == "running"
        assert (await client.sandboxes.connect("sb-1")).id == sbx.id
        async with sbx:
            pass
        await client.sandboxes.kill("sb-1")
        assert await client.keys.list() == []
    assert len(api.calls("DELETE", SB)) == 2


async def test_transport_errors() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(APIConnectionError):
        await AsyncClient(API_URL, API_KEY, transport=httpx.MockTransport(refused)).sandboxes.list()
    with pytest.raises(pandastack.TimeoutError) as info:
        await AsyncClient(API_URL, API_KEY, transport=httpx.MockTransport(slow)).sandboxes.list()
    assert isinstance(info.value, builtins.TimeoutError)


async def test_unconfigured() -> None:
    with pytest.raises(ConfigError):
        await AsyncSandbox.create()
