"""The file watch route and files/batch over the fake runtime (no VM): the SSE framing of a
watch (watching first, one event per file event, then end or overflow and nothing after), a
missing directory as a 404 before any stream, and write_many's 413 and 422 answers."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.sdk._sse import SSEDecoder
from pandastack.wire.sandboxes import MAX_WRITE_MANY_FILES
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
async def api(tmp_path: Path, db: str) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path, db_url=db), FakeRuntime(tmp_path)) as a:
        yield a


async def sandbox(api: Api) -> str:
    r = await api.client.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    return sid


async def events(api: Api, sid: str, path: str) -> list[tuple[str, object]]:
    r = await api.client.get(f"/v1/sandboxes/{sid}/files/watch", params={"path": path})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    decoder = SSEDecoder()
    got = decoder.feed(r.content) + decoder.close()
    return [(e.event, json.loads(e.data)) for e in got]


async def test_watch_stream(api: Api) -> None:
    sid = await sandbox(api)
    assert await events(api, sid, "/work") == [
        ("watching", {"path": "/work", "recursive": True}),
        ("create", {"type": "create", "path": "/work/a", "old_path": None, "is_dir": False}),
        ("rename", {"type": "rename", "path": "/work/b", "old_path": "/work/a",
                    "is_dir": False}),
        ("end", {"reason": "removed"}),
    ]
    flood = await events(api, sid, "/work/flood")
    assert [name for name, _ in flood] == ["watching", "create", "rename", "overflow"]
    assert_envelope(await api.client.get(f"/v1/sandboxes/{sid}/files/watch",
                                         params={"path": "/missing"}), 404, "not_found")


async def test_write_many(api: Api) -> None:
    sid = await sandbox(api)
    url = f"/v1/sandboxes/{sid}/files/batch"
    r = await api.client.post(url, json={"files": [
        {"path": "/work/a", "data": "héllo"},
        {"path": "/work/b", "data": base64.b64encode(b"\x00\xff").decode(),
         "encoding": "base64", "mode": 0o600}]})
    assert r.status_code == 200, r.text
    assert r.json() == {"files": [{"path": "/work/a", "size": 6}, {"path": "/work/b", "size": 2}]}
    got = await api.client.get(f"/v1/sandboxes/{sid}/files", params={"path": "/work/b"})
    assert got.content == b"\x00\xff"

    too_many = [{"path": f"/work/{i}", "data": ""} for i in range(MAX_WRITE_MANY_FILES + 1)]
    assert_envelope(await api.client.post(url, json={"files": too_many}), 422,
                    "validation_error")
    assert_envelope(await api.client.post(url, json={"files": []}), 422, "validation_error")
    assert_envelope(await api.client.post(url, json={"files": [
        {"path": "/work/c", "data": "not base64!", "encoding": "base64"}]}), 422,
        "validation_error")
    assert_envelope(await api.client.post(url, json={"files": [
        {"path": "/work/\u0000", "data": "x"}]}), 422, "validation_error")
    assert_envelope(await api.client.post(url, json={"files": [
        {"path": "/work/big", "data": "x" * (2 << 20)}]}), 413, "payload_too_large")
    listed = await api.client.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/work"})
    assert sorted(e["name"] for e in listed.json()["entries"]) == ["a", "b"]
