"""A host out of reach (its agent killed or restarting), at the HTTP layer over the in-memory
runtime: requests for its sandboxes answer 503 `host_unavailable` (never a 500 or a hang), the
reaper neither fails nor forgets them, and what ended meanwhile is killed once it is back.
The same with a real `pandastack agent` process: tests/server/api/test_api_agent_process.py."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pandastack.hostport.errors import HostUnavailable
from tests.server.conftest import assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


class Reachable:
    """The fake host's port, answering HostUnavailable for every call while `down` (the
    handles it gives out too, as a host client's do)."""

    def __init__(self, inner: Any, host: Reachable | None = None) -> None:
        self.inner = inner
        self.host = host or self
        self.down = False

    def handle(self, sandbox_id: str) -> Reachable:
        return Reachable(self.inner.handle(sandbox_id), self)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if inspect.isasyncgenfunction(attr):
            async def stream(*args: Any, **kwargs: Any) -> Any:
                if self.host.down:
                    raise HostUnavailable("host agent unix:/nonexistent.sock: connection "
                                          "refused")
                async for item in attr(*args, **kwargs):
                    yield item
            return stream
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.host.down:
                raise HostUnavailable("host agent unix:/nonexistent.sock: connection refused")
            return await attr(*args, **kwargs)
        return call


async def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_requests_answer_host_unavailable_and_nothing_is_lost(tmp_path: Path) -> None:
    host = Reachable(FakeRuntime(tmp_path / "rt"))
    async with running_app(make_settings(tmp_path), host) as api:
        c = api.client
        r = await c.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid, doomed = r.json()["id"], (await c.post("/v1/sandboxes", json={})).json()["id"]

        host.down = True
        for method, path, body in (
                ("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"}),
                ("GET", f"/v1/sandboxes/{sid}/network", None),
                ("GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname", None),
                ("POST", f"/v1/sandboxes/{sid}/pause", None),
                ("POST", f"/v1/sandboxes/{sid}/snapshots", {}),
                ("POST", "/v1/sandboxes", {})):
            r = await c.request(method, path, json=body)
            assert_envelope(r, 503, "host_unavailable")
            assert r.headers["retry-after"] == "5"
        # The reaper runs every 0.2 s: several passes must leave the sandbox as it was.
        await asyncio.sleep(1.0)
        row = (await c.get(f"/v1/sandboxes/{sid}")).json()
        assert row["state"] == "running", row
        # Ended while out of reach: the row ends at once, the VM when the host is back.
        assert (await c.delete(f"/v1/sandboxes/{doomed}")).status_code == 204
        assert doomed in host.inner.sandboxes

        host.down = False
        await until(lambda: doomed in host.inner.killed)
        r = await c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
        assert r.status_code == 200, r.text


async def test_a_server_started_while_the_host_is_down_reconciles_when_it_is_back(
        tmp_path: Path) -> None:
    # A VM the store has no row for: with kill_unknown_vms the reconcile kills it (the
    # default leaves it running and reports it: test_api_fake's test_reconcile_on_start).
    settings = make_settings(tmp_path, kill_unknown_vms=True)
    inner = FakeRuntime(tmp_path / "rt")
    async with running_app(settings, inner) as api:
        sid = (await api.client.post("/v1/sandboxes", json={})).json()["id"]
    stray = await inner.create()
    host = Reachable(inner)
    host.down = True
    async with running_app(settings, host) as api:
        assert (await api.client.get("/health")).status_code == 200
        assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/exec",
                                              json={"cmd": "true"}), 503, "host_unavailable")
        assert stray.id in inner.sandboxes
        host.down = False
        await until(lambda: stray.id in inner.killed)
        r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
        assert r.status_code == 200, r.text
