"""The MCP tools against a live server, driven by the `mcp` package's own client: over stdio
(`pandastack mcp` spawned as an agent runtime spawns it) and over streamable HTTP (`/mcp` of
the server, Bearer key). Each lists the tools and runs create -> write_file -> run_command ->
run_code -> kill on a code-interpreter sandbox; over HTTP run_code draws a matplotlib chart,
which comes back as PNG image content."""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ImageContent, TextContent

from pandastack import Client as PandastackClient
from pandastack.mcp.tools import TOOL_NAMES
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.timeout(900)]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = """\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent), result
    data = json.loads(first.text)
    assert isinstance(data, dict)
    return data


async def _call(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result
    return _payload(result)


async def _agent_loop(client: Client, live_server: LiveServer, plot_png: bool = True) -> None:
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == set(TOOL_NAMES)
    assert all(t.description and t.input_schema.get("type") == "object" for t in listed.tools)

    created = await _call(client, "create_sandbox", template="code-interpreter",
                          ttl_seconds=600, metadata={"suite": "mcp"})
    sid = created["id"]
    try:
        wrote = await _call(client, "write_file", sandbox_id=sid, path="/work/hello.py",
                            content="print('hello from mcp')\n")
        assert wrote["size"] == len("print('hello from mcp')\n")
        ran = await _call(client, "run_command", sandbox_id=sid,
                          command="python3 /work/hello.py; echo oops >&2; exit 3")
        assert ran["exit_code"] == 3 and ran["stdout"] == "hello from mcp\n"
        assert ran["stderr"] == "oops\n" and ran["truncated"] is False

        if plot_png:
            plot = await client.call_tool("run_code", {"sandbox_id": sid, "code": PLOT})
            assert not plot.is_error, plot
            images = [c for c in plot.content if isinstance(c, ImageContent)]
            assert images and images[0].mime_type == "image/png"
            assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)

        failed = await _call(client, "run_code", sandbox_id=sid, code="1 / 0")
        assert failed["error"]["name"] == "ZeroDivisionError"

        # An API error is a tool error with the API's code, and the server goes on serving.
        missing = await client.call_tool("read_file", {"sandbox_id": sid,
                                                       "path": "/work/missing.txt"})
        assert missing.is_error and _payload(missing)["error"]["code"] == "not_found"
        # An input over its bound is refused before any request is made.
        huge = await client.call_tool("run_command", {"sandbox_id": sid,
                                                      "command": "x" * 200_000})
        assert huge.is_error
    finally:
        killed = await _call(client, "kill_sandbox", sandbox_id=sid)
    assert killed["killed"] is True
    with PandastackClient(live_server.api_url, live_server.api_key) as api:
        assert sid not in {s.id for s in api.sandboxes.list()}


async def test_mcp_over_stdio(live_server: LiveServer) -> None:
    env = {**os.environ, "PANDASTACK_API": live_server.api_url,
           "PANDASTACK_API_KEY": live_server.api_key}
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "pandastack.cli.main", "mcp"], env=env)
    async with Client(params) as client:
        # The chart's image content is the tools' own (the HTTP test draws it); here the
        # transport carries the rest (~15 s of matplotlib under TCG on a loaded host).
        await _agent_loop(client, live_server, plot_png=False)


async def test_mcp_over_http(live_server: LiveServer) -> None:
    url = live_server.api_url + "/mcp"
    # The REST API's auth: no key, no MCP.
    refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"

    headers = {"Authorization": f"Bearer {live_server.api_key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=600) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        await _agent_loop(client, live_server)
