"""`GET /v1/sandboxes?include_ended=false`: the live sandboxes only (what the SDK's `list()`
asks for by default). Without the parameter the route lists every sandbox, as it always did;
`state=` picks one state, ended or not, whatever `include_ended` says. Over the in-memory
runtime. Fast."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path)) as a:
        yield a


async def ids(api: Api, **params: str) -> list[str]:
    r = await api.client.get("/v1/sandboxes", params=params)
    assert r.status_code == 200, r.text
    return [s["id"] for s in r.json()["sandboxes"]]


async def test_include_ended_false_lists_only_live_sandboxes(api: Api) -> None:
    made = []
    for _ in range(3):
        r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 60})
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
    running, paused, killed = made
    assert (await api.client.post(f"/v1/sandboxes/{paused}/pause")).status_code == 200
    assert (await api.client.delete(f"/v1/sandboxes/{killed}")).status_code == 204

    assert await ids(api) == made  # backward compatible: every sandbox
    assert await ids(api, include_ended="true") == made
    assert await ids(api, include_ended="false") == [running, paused]
    assert await ids(api, include_ended="false", state="killed") == [killed]
    assert await ids(api, include_ended="false", state="paused") == [paused]
    assert_envelope(await api.client.get("/v1/sandboxes", params={"include_ended": "maybe"}),
                    422, "validation_error")
