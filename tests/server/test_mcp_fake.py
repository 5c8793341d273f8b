"""`/mcp` over an in-memory runtime, driven by the `mcp` package's streamable HTTP client: the
REST API's auth in front, the key's team behind every tool (the tools call the app in process
with the caller's key), and API errors as tool errors. Fast; tests/e2e/test_mcp.py is the
same on real VMs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from pandastack.mcp.tools import TOOL_NAMES
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path)) as a:
        yield a


@asynccontextmanager
async def mcp_client(api: Api, key: str) -> AsyncIterator[Client]:
    transport = httpx2.ASGITransport(app=api.app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://test",
                                  headers={"Authorization": f"Bearer {key}"}) as http, \
            Client(streamable_http_client("http://test/mcp", http_client=http)) as client:
        yield client


def payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    data: dict[str, Any] = json.loads(first.text)
    return data


async def test_mcp_needs_a_valid_key(api: Api) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert_envelope(await api.client.post("/mcp", json=body, headers={"Authorization": ""}),
                    401, "unauthorized")
    key = await api.new_key("acme")
    listed = await api.client.get("/v1/keys")
    key_id = next(k["id"] for k in listed.json()["keys"] if k["team"] == "acme")
    assert (await api.client.delete(f"/v1/keys/{key_id}")).status_code == 204
    assert_envelope(await api.client.post("/mcp", json=body, headers=api.headers(key)),
                    401, "unauthorized")


async def test_tools_act_as_the_keys_team(api: Api) -> None:
    acme, other = await api.new_key("acme"), await api.new_key("other")
    async with mcp_client(api, acme) as client:
        assert {t.name for t in (await client.list_tools()).tools} == set(TOOL_NAMES)
        created = await client.call_tool("create_sandbox", {"ttl_seconds": 600})
        assert not created.is_error, created
        sid = payload(created)["id"]
        ran = await client.call_tool("run_command", {"sandbox_id": sid, "command": "echo hi"})
        assert not ran.is_error and payload(ran)["exit_code"] == 0
        assert "echo hi" in payload(ran)["stdout"]
    async with mcp_client(api, other) as client:
        theirs = await client.call_tool("run_command", {"sandbox_id": sid, "command": "id"})
        assert theirs.is_error and payload(theirs)["error"]["code"] == "not_found"
        listed = payload(await client.call_tool("list_sandboxes", {}))
        assert listed["sandboxes"] == []
        killed = await client.call_tool("kill_sandbox", {"sandbox_id": sid})
        assert killed.is_error and payload(killed)["error"]["code"] == "not_found"
    r = await api.client.get(f"/v1/sandboxes/{sid}", headers=api.headers(acme))
    assert r.status_code == 200 and r.json()["state"] == "running"
    async with mcp_client(api, acme) as client:
        killed = await client.call_tool("kill_sandbox", {"sandbox_id": sid})
        assert not killed.is_error, killed
