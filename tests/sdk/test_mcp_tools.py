"""The MCP tool layer (pandastack.mcp.tools) through the `mcp` package's in-memory client, on
an SDK client whose transport is a fake API: schemas and bounds, what the model reads back
(clipped output, images, tracebacks), and every failure as a tool error, never a crash."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ImageContent, TextContent

from pandastack.mcp.results import MAX_OUTPUT_CHARS
from pandastack.mcp.tools import (
    MAX_COMMAND_CHARS,
    MAX_READ_BYTES,
    MAX_SEARCH_RESULTS,
    TOOL_NAMES,
    build_server,
)
from pandastack.sdk import AsyncClient
from tests.sdk.fakes import (
    API_KEY,
    API_URL,
    FILE_ENTRY,
    SANDBOX,
    FakeAPI,
    body,
    envelope,
    exec_result,
    reply,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
SID = "sbx-0123456789ab"
INFO = {**SANDBOX, "id": SID}


def _with_sandbox(api: FakeAPI) -> FakeAPI:
    """Routes to create, get and kill sandbox SID (an id, not a name, to the SDK)."""
    return (api.on("POST", "/v1/sandboxes", reply(201, INFO))
            .on("GET", f"/v1/sandboxes/{SID}", reply(200, INFO))
            .on("DELETE", f"/v1/sandboxes/{SID}", reply(204)))


def _server(api: FakeAPI | Callable[[httpx.Request], httpx.Response]) -> Any:
    @asynccontextmanager
    async def opener(_ctx: Context) -> AsyncIterator[AsyncClient]:
        async with AsyncClient(API_URL, API_KEY, transport=httpx.MockTransport(api)) as c:
            yield c

    return build_server(opener)


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    data: dict[str, Any] = json.loads(first.text)
    assert result.structured_content == data
    return data


async def _call(api: FakeAPI, tool: str, **arguments: Any) -> CallToolResult:
    async with Client(_server(api)) as client:
        return await client.call_tool(tool, arguments)


async def test_tools_are_listed_with_bounded_schemas() -> None:
    async with Client(_server(FakeAPI())) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert tuple(tools) == TOOL_NAMES
    for tool in tools.values():
        assert tool.description and tool.input_schema["type"] == "object"
    command = tools["run_command"].input_schema["properties"]["command"]
    assert command["maxLength"] == MAX_COMMAND_CHARS
    assert tools["run_command"].input_schema["required"] == ["sandbox_id", "command"]
    assert "maxLength" in tools["write_file"].input_schema["properties"]["content"]
    assert tools["kill_sandbox"].annotations is not None
    assert tools["kill_sandbox"].annotations.destructive_hint is True


async def test_an_api_error_is_a_tool_error_with_its_code() -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes/sbx-999999999999", reply(
        404, envelope("not_found", "sandbox sbx-999999999999 not found", "req-7")))
    result = await _call(api, "run_command", sandbox_id="sbx-999999999999", command="ls")
    assert result.is_error
    assert _payload(result) == {"error": {"code": "not_found", "status": 404,
                                          "message": "sandbox sbx-999999999999 not found",
                                          "request_id": "req-7"}}


async def test_an_input_over_its_bound_is_refused_before_any_request() -> None:
    api = _with_sandbox(FakeAPI())
    result = await _call(api, "run_command", sandbox_id=SID,
                         command="x" * (MAX_COMMAND_CHARS + 1))
    assert result.is_error
    first = result.content[0]
    assert isinstance(first, TextContent) and "at most 100000 characters" in first.text
    assert api.requests == []


async def test_an_unexpected_failure_is_a_tool_error_and_the_server_goes_on() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("secret detail")

    async with Client(_server(broken)) as client:
        first = await client.call_tool("list_sandboxes", {})
        again = await client.call_tool("list_sandboxes", {})
    for result in (first, again):
        assert result.is_error
        assert "secret detail" not in json.dumps(_payload(result))


async def test_run_command_clips_long_output_and_says_so() -> None:
    long = "a" * (MAX_OUTPUT_CHARS * 2) + "THE END"
    api = _with_sandbox(FakeAPI()).on("POST", f"/v1/sandboxes/{SID}/exec", reply(
        200, exec_result(exit_code=2, stdout=long, stderr="bad\n")))
    data = _payload(await _call(api, "run_command", sandbox_id=SID, command="make",
                                timeout_seconds=5, cwd="/work"))
    assert data["exit_code"] == 2 and data["stderr"] == "bad\n" and data["truncated"] is True
    assert data["stdout"].endswith("THE END") and len(data["stdout"]) < MAX_OUTPUT_CHARS + 100
    sent = body(api.last("POST", f"/v1/sandboxes/{SID}/exec"))
    assert sent["cmd"] == "make" and sent["timeout_seconds"] == 5 and sent["cwd"] == "/work"


async def test_run_code_returns_charts_as_images_and_the_traceback() -> None:
    png = base64.b64encode(PNG).decode()
    execution = {"stdout": "hi\n", "stderr": "", "execution_count": 1,
                 "results": [{"data": {"image/png": png, "text/plain": "<Figure>"}},
                             {"data": {"text/plain": "42"}, "is_main_result": True}],
                 "error": {"name": "ValueError", "value": "no", "traceback": "Traceback..."}}
    api = _with_sandbox(FakeAPI()).on("POST", f"/v1/sandboxes/{SID}/code",
                                      reply(200, execution))
    result = await _call(api, "run_code", sandbox_id=SID, code="plot()")
    data = _payload(result)
    assert data["stdout"] == "hi\n"
    assert data["results"][1] == {"is_main_result": True, "formats": ["text/plain"],
                                  "text/plain": "42"}
    assert data["results"][0]["image"] == 1
    assert data["error"] == {"name": "ValueError", "value": "no", "traceback": "Traceback..."}
    images = [c for c in result.content if isinstance(c, ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data) == PNG


def _file_api(content: bytes, size: int | None = None) -> FakeAPI:
    entry = {**FILE_ENTRY, "size": len(content) if size is None else size}
    return (_with_sandbox(FakeAPI())
            .on("GET", f"/v1/sandboxes/{SID}/files/stat", reply(200, entry))
            .on("GET", f"/v1/sandboxes/{SID}/files",
                lambda r: httpx.Response(200, content=content)))


async def test_grep_and_glob_files_are_bounded_for_the_model() -> None:
    many = [{"path": f"/w/{i}.py", "line": 1, "text": "x" * 5000}
            for i in range(MAX_SEARCH_RESULTS + 1)]
    api = (_with_sandbox(FakeAPI())
           .on("POST", f"/v1/sandboxes/{SID}/files/grep",
               reply(200, {"matches": many, "truncated": False}))
           .on("POST", f"/v1/sandboxes/{SID}/files/glob",
               reply(200, {"paths": ["/w/a.py"], "truncated": True})))
    found = _payload(await _call(api, "grep_files", sandbox_id=SID, path="/w", pattern="x",
                                 ignore_case=True))
    assert body(api.last("POST", f"/v1/sandboxes/{SID}/files/grep")) == {
        "path": "/w", "pattern": "x", "ignore_case": True}
    assert (len(found["matches"]), found["total"], found["truncated"]) == (
        MAX_SEARCH_RESULTS, MAX_SEARCH_RESULTS + 1, True)
    assert len(found["matches"][0]["text"]) < 600  # a long line is clipped
    assert _payload(await _call(api, "glob_files", sandbox_id=SID, path="/w",
                                pattern="**/*.py")) == {
        "path": "/w", "paths": ["/w/a.py"], "total": 1, "truncated": True}
    refused = await _call(api, "grep_files", sandbox_id=SID, path="/w", pattern="x" * 1025)
    assert refused.is_error and "1024" in str(refused.content[0])


async def test_read_file_text_binary_image_and_too_large() -> None:
    text = _payload(await _call(_file_api(b"hello\n"), "read_file", sandbox_id=SID,
                                path="/work/a.txt"))
    assert text["encoding"] == "utf-8" and text["content"] == "hello\n"

    binary = _payload(await _call(_file_api(b"\xff\xfe\x00"), "read_file", sandbox_id=SID,
                                  path="/work/a.bin"))
    assert binary["encoding"] == "base64" and base64.b64decode(binary["content"]) == b"\xff\xfe\x00"

    image = await _call(_file_api(PNG), "read_file", sandbox_id=SID, path="/work/a.png")
    assert any(isinstance(c, ImageContent) for c in image.content)

    big = _file_api(b"", size=50 << 20)
    refused = await _call(big, "read_file", sandbox_id=SID, path="/work/big.log")
    assert refused.is_error and _payload(refused)["error"]["code"] == "too_large"
    assert "run_command" in _payload(refused)["error"]["message"]
    assert big.calls("GET", f"/v1/sandboxes/{SID}/files") == []  # never read into memory

    over = await _call(_file_api(b"a" * (MAX_READ_BYTES + 1)), "read_file",
                       sandbox_id=SID, path="/work/a.txt")
    assert over.is_error and _payload(over)["error"]["code"] == "too_large"


@pytest.mark.parametrize(("content", "encoding", "sent"), [
    ("print(1)\n", "utf-8", b"print(1)\n"),
    (base64.b64encode(b"\x00\x01").decode(), "base64", b"\x00\x01"),
])
async def test_write_file_sends_the_bytes(content: str, encoding: str, sent: bytes) -> None:
    api = _with_sandbox(FakeAPI()).on("PUT", f"/v1/sandboxes/{SID}/files", reply(
        200, {"path": "/work/a", "size": len(sent)}))
    data = _payload(await _call(api, "write_file", sandbox_id=SID, path="/work/a",
                                content=content, encoding=encoding))
    assert data == {"path": "/work/a", "size": len(sent)}
    assert api.last("PUT", f"/v1/sandboxes/{SID}/files").content == sent


async def test_write_file_refuses_bad_base64() -> None:
    api = _with_sandbox(FakeAPI())
    result = await _call(api, "write_file", sandbox_id=SID, path="/work/a",
                         content="not base64!", encoding="base64")
    assert result.is_error and _payload(result)["error"]["code"] == "invalid_argument"
    assert api.calls("PUT", f"/v1/sandboxes/{SID}/files") == []


async def test_create_fork_snapshot_kill_and_url() -> None:
    child = {**SANDBOX, "id": "sb-2"}
    api = (_with_sandbox(FakeAPI())
           .on("POST", f"/v1/sandboxes/{SID}/fork", reply(201, {"parent": SID,
                                                              "sandboxes": [child]}))
           .on("POST", f"/v1/sandboxes/{SID}/snapshots", reply(201, {
               "id": "snap-1", "source_sandbox": SID, "template": "base",
               "created_at": 1.0, "vcpus": 1, "memory_mb": 512}))
           .on("POST", f"/v1/sandboxes/{SID}/ports/8000/signed-url", reply(
               200, {"url": "http://x/signed", "expires_at": 5.0})))
    created = _payload(await _call(api, "create_sandbox", template="base", ttl_seconds=600,
                                   metadata={"task": "t"}, name="user-42"))
    assert created["id"] == SID
    sent = body(api.last("POST", "/v1/sandboxes"))
    assert sent["ttl_seconds"] == 600 and sent["name"] == "user-42"
    forked = _payload(await _call(api, "fork_sandbox", sandbox_id=SID, count=1))
    assert [s["id"] for s in forked["sandboxes"]] == ["sb-2"]
    url = _payload(await _call(api, "get_url", sandbox_id=SID, port=8000))
    assert url["url"] == "http://x/signed"
    killed = _payload(await _call(api, "kill_sandbox", sandbox_id=SID))
    assert killed == {"sandbox_id": SID, "killed": True}
    snap = await _call(api, "snapshot_sandbox", sandbox_id=SID)
    assert not snap.is_error, snap
    assert _payload(snap)["snapshot_id"] == "snap-1"


async def test_a_sandbox_file_is_a_resource() -> None:
    async with Client(_server(_file_api(b"a,b\n1,2\n"))) as client:
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["sandbox://{sandbox_id}/files{+path}"]
        read = await client.read_resource(f"sandbox://{SID}/files/work/out.csv")
    assert [getattr(c, "text", None) for c in read.contents] == ["a,b\n1,2\n"]
    api = _file_api(b"")
    async with Client(_server(api)) as client:
        await client.read_resource(f"sandbox://{SID}/files/work/out.csv")
    assert api.last("GET", f"/v1/sandboxes/{SID}/files").url.params["path"] == "/work/out.csv"


async def test_a_missing_file_resource_is_a_protocol_error_with_the_code() -> None:
    api = _with_sandbox(FakeAPI()).on("GET", f"/v1/sandboxes/{SID}/files/stat", reply(
        404, envelope("not_found", "no such file /nope")))
    async with Client(_server(api)) as client:
        with pytest.raises(MCPError, match="not_found"):
            await client.read_resource(f"sandbox://{SID}/files/nope")
