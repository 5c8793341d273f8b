"""`Sandbox.list()`, `AsyncSandbox.list()` and `client.sandboxes.list()`, against a real uvicorn
server over the in-memory runtime (tests/server/serve_fake.py): live sandboxes by default,
ended ones with `include_ended=True` or `state=`, and every item is a handle that is used,
killed or closed without looking the sandbox up again. Fast."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pandastack.sdk import AsyncClient, AsyncSandbox, Client, Sandbox
from tests.server.live import FakeServer, fake_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-list")) as srv:
        yield srv


class Recording(httpx.HTTPTransport):
    """httpx's transport, remembering each request's method and path."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.path}")
        return super().handle_request(request)


class AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.path}")
        return await super().handle_async_request(request)


def test_sync_list_is_live_by_default_and_items_are_handles(server: FakeServer) -> None:
    label = {"suite": secrets.token_hex(4)}
    kw: dict[str, Any] = {"api_url": server.url, "api_key": server.admin_key}
    with Client(**kw) as client:
        running, paused, ended = (client.sandboxes.create(ttl_seconds=300, metadata=label)
                                  for _ in range(3))
        paused.pause()
        ended.kill()

        live = Sandbox.list(metadata=label, **kw)
        assert all(isinstance(s, Sandbox) for s in live)
        assert sorted(s.id for s in live) == sorted([running.id, paused.id])
        every = Sandbox.list(metadata=label, include_ended=True, **kw)
        assert sorted(s.id for s in every) == sorted([running.id, paused.id, ended.id])
        assert [s.id for s in Sandbox.list("killed", label, **kw)] == [ended.id]
        assert [s.id for s in Sandbox.list("paused", label, **kw)] == [paused.id]
        for s in live + every:
            s.close()

        transport = Recording()
        [item] = Sandbox.list("running", label, transport=transport, **kw)
        assert item.info.state == "running"
        assert item.exec("true").exit_code == 0
        item.kill()
        item.close()
        assert transport.seen == ["GET /v1/sandboxes", f"POST /v1/sandboxes/{running.id}/exec",
                                  f"DELETE /v1/sandboxes/{running.id}"]

        [mine] = client.sandboxes.list(metadata=label)
        assert isinstance(mine, Sandbox) and mine.id == paused.id
        mine.kill()  # on the client's own connections
        assert client.sandboxes.list(metadata=label) == []
        assert len(client.sandboxes.list(metadata=label, include_ended=True)) == 3


async def test_async_list_is_live_by_default_and_items_are_handles(server: FakeServer) -> None:
    label = {"suite": secrets.token_hex(4)}
    kw: dict[str, Any] = {"api_url": server.url, "api_key": server.admin_key}
    async with AsyncClient(**kw) as client:
        running = await client.sandboxes.create(ttl_seconds=300, metadata=label)
        ended = await client.sandboxes.create(ttl_seconds=300, metadata=label)
        await ended.kill()

        transport = AsyncRecording()
        [item] = await AsyncSandbox.list(metadata=label, transport=transport, **kw)
        assert isinstance(item, AsyncSandbox) and item.id == running.id
        assert (await item.exec("true")).exit_code == 0
        await item.kill()
        await item.close()
        assert transport.seen == ["GET /v1/sandboxes", f"POST /v1/sandboxes/{running.id}/exec",
                                  f"DELETE /v1/sandboxes/{running.id}"]

        assert await client.sandboxes.list(metadata=label) == []
        every = await client.sandboxes.list(metadata=label, include_ended=True)
        assert all(isinstance(s, AsyncSandbox) for s in every)
        assert sorted(s.id for s in every) == sorted([running.id, ended.id])
        assert [s.id for s in await client.sandboxes.list("killed", label)] != []
        for s in await AsyncSandbox.list(metadata=label, include_ended=True, **kw):
            await s.close()
