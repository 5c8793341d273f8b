"""E2B's REST API through the official `e2b` SDK (the newest, 2.63: create and connect on
/v2), sync and async, against a live server booting real VMs; and the create that SDKs before
2.51 send (`POST /sandboxes`), as raw HTTP. Few sandboxes, each used for many steps; shapes
and errors are tested on the fake host (tests/server/compat/e2b/test_rest_fake.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException

from pandastack.server.compat.e2b.rest.base import e2b_key
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(900)]


def opts(server: LiveServer, key: str | None = None) -> dict[str, Any]:
    return server.e2b(key)


def run_in(server: LiveServer, sandbox_id: str, cmd: str) -> str:
    """A command through our own API: what E2B's daemon would run is another helper's test."""
    r = httpx.post(f"{server.api_url}/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd},
                   headers={"Authorization": f"Bearer {server.api_key}"}, timeout=300)
    assert r.status_code == 200, r.text
    out: str = r.json()["stdout"]
    return out


def other_team_key(server: LiveServer) -> str:
    r = httpx.post(f"{server.api_url}/v1/keys", json={"name": "e2b", "team": "e2b-other"},
                   headers={"Authorization": f"Bearer {server.api_key}"}, timeout=30)
    assert r.status_code == 201, r.text
    key: str = r.json()["key"]
    return key


def test_sync_sdk_create_list_timeout_pause_connect_kill(live_server: LiveServer) -> None:
    run = uuid.uuid4().hex[:8]
    o = opts(live_server)
    a = Sandbox.create("base", timeout=120, metadata={"run": run, "n": "a"}, **o)
    b = Sandbox.create("base", timeout=120, metadata={"run": run, "n": "b"}, **o)
    try:
        assert a.sandbox_id != b.sandbox_id
        info = Sandbox.get_info(a.sandbox_id, **o)
        assert info.state == SandboxState.RUNNING and info.metadata == {"run": run, "n": "a"}
        assert info.template_id == "base" and info.envd_version

        # the metadata filter, one sandbox a page, newest first (E2B's default order)
        pages = Sandbox.list(query=SandboxQuery(metadata={"run": run}), limit=1, **o)
        seen = []
        while pages.has_next:
            seen.append([s.sandbox_id for s in pages.next_items()])
        assert seen == [[b.sandbox_id], [a.sandbox_id]]

        # timeout: seconds from now, seen in the info
        Sandbox.set_timeout(a.sandbox_id, 900, **o)
        end = Sandbox.get_info(a.sandbox_id, **o).end_at
        assert abs(end.timestamp() - (datetime.now(UTC).timestamp() + 900)) < 30

        # pause keeps files (and memory); connect wakes it: 201, then 200 when running
        run_in(live_server, a.sandbox_id, "echo kept > /root/kept.txt")
        assert a.pause() is True
        assert Sandbox.get_info(a.sandbox_id, **o).state == SandboxState.PAUSED
        paused = Sandbox.list(query=SandboxQuery(metadata={"run": run},
                                                 state=[SandboxState.PAUSED]), **o)
        assert [s.sandbox_id for s in paused.next_items()] == [a.sandbox_id]
        h = {"X-API-Key": live_server.api_key}
        r = httpx.post(f"{live_server.api_url}/v2/sandboxes/{a.sandbox_id}/connect",
                       json={"timeout": 300}, headers=h, timeout=300)
        assert r.status_code == 201, r.text
        assert run_in(live_server, a.sandbox_id, "cat /root/kept.txt") == "kept\n"
        again = Sandbox.connect(a.sandbox_id, timeout=300, **o)  # 200: it was running
        assert again.sandbox_id == a.sandbox_id

        # another team's key finds nothing, and changes nothing
        other = opts(live_server, other_team_key(live_server))
        with pytest.raises(NotFoundException):
            Sandbox.get_info(b.sandbox_id, **other)
        with pytest.raises(NotFoundException):
            Sandbox.connect(b.sandbox_id, **other)
        assert Sandbox.kill(b.sandbox_id, **other) is False
        assert list(Sandbox.list(query=SandboxQuery(metadata={"run": run}), **other)
                    .next_items()) == []
        assert Sandbox.get_info(b.sandbox_id, **o).state == SandboxState.RUNNING

        # kill, then it is gone
        assert Sandbox.kill(a.sandbox_id, **o) is True
        with pytest.raises(NotFoundException):
            Sandbox.get_info(a.sandbox_id, **o)
        assert Sandbox.kill(a.sandbox_id, **o) is False
    finally:
        for s in (a, b):
            Sandbox.kill(s.sandbox_id, **o)


async def test_async_sdk_create_info_auto_pause_kill(live_server: LiveServer) -> None:
    run = uuid.uuid4().hex[:8]
    o = opts(live_server)
    s = await AsyncSandbox.create("base", timeout=60, metadata={"run": run},
                                  lifecycle={"on_timeout": "pause"}, **o)
    try:
        info = await AsyncSandbox.get_info(s.sandbox_id, **o)
        assert info.state == SandboxState.RUNNING and info.metadata == {"run": run}
        assert info.lifecycle is not None and info.lifecycle["on_timeout"] == "pause"
        listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"run": run}),
                                         **o).next_items()
        assert [x.sandbox_id for x in listed] == [s.sandbox_id]

        # its timeout hibernates it (autoPause) rather than ending it; connect wakes it
        run_in(live_server, s.sandbox_id, "echo kept > /root/kept.txt")
        await AsyncSandbox.set_timeout(s.sandbox_id, 1, **o)
        deadline = time.monotonic() + 300
        while (await AsyncSandbox.get_info(s.sandbox_id, **o)).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "not paused at its timeout"
            await asyncio.sleep(0.5)
        await AsyncSandbox.connect(s.sandbox_id, timeout=600, **o)
        info = await AsyncSandbox.get_info(s.sandbox_id, **o)
        assert info.state == SandboxState.RUNNING
        assert info.end_at.timestamp() > time.time() + 500
        assert run_in(live_server, s.sandbox_id, "cat /root/kept.txt") == "kept\n"
    finally:
        assert await AsyncSandbox.kill(s.sandbox_id, **o) is True
    with pytest.raises(NotFoundException):
        await AsyncSandbox.get_info(s.sandbox_id, **o)


def test_older_sdks_create_on_sandboxes_with_the_e2b_key_alias(live_server: LiveServer
                                                               ) -> None:
    """The body and key e2b 2.45.1 sends: `POST /sandboxes` (NewSandbox with `secure`), and
    an `e2b_<hex>` key (it refuses others unless E2B_VALIDATE_API_KEY=false)."""
    h = {"X-API-KEY": e2b_key(live_server.api_key), "Content-Type": "application/json"}
    body = {"templateID": "base", "timeout": 60, "secure": True, "metadata": {},
            "envVars": {"GREETING": "hi"}, "allow_internet_access": True}
    with httpx.Client(base_url=live_server.api_url, headers=h, timeout=300) as c:
        r = c.post("/sandboxes", json=body)
        assert r.status_code == 201, r.text
        got = r.json()
        assert got["envdAccessToken"] and got["trafficAccessToken"] and got["envdVersion"]
        assert got["domain"] == f"localhost:{live_server.preview_port}"
        sid = got["sandboxID"]
        try:
            assert run_in(live_server, sid, "echo $GREETING") == "hi\n"
            r = c.post(f"/sandboxes/{sid}/connect", json={"timeout": 60})
            assert r.status_code == 200, r.text
        finally:
            assert c.delete(f"/sandboxes/{sid}").status_code == 204
        assert c.get(f"/sandboxes/{sid}").status_code == 404
