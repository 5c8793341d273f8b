"""Template rows in a real store (SQLite and PostgreSQL, the `db` fixture): the queries on hot
paths (create from a team template, list, versions, build status) never read a build's spec
or logs, the stored spec keeps no COPY file bodies, dead versions are pruned by the reaper
without ever reusing a version number, and every template store call made from a request or a
build runs off the event loop. The runtime and the builder are fakes (tests/server/fakes.py);
the database is not."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from pandastack.server.sandboxes.lifecycle import sweep
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime, ScriptedBuilder

SPEC = {"from_template": "base", "steps": [{"kind": "run", "command": "echo hi"}]}
FAILING = {"from_template": "base", "steps": [{"kind": "run", "command": "fail"}]}
FILE = b"the file body \x00\xff" * 4096


def copy_spec(data: bytes = FILE) -> dict[str, Any]:
    return {"from_template": "base", "steps": [
        {"kind": "copy", "dst": "/srv", "files": [
            {"path": "app.bin", "mode": 0o600, "content_b64": base64.b64encode(data).decode()}]},
        {"kind": "run", "command": "echo hi"}]}


@pytest.fixture
async def env(tmp_path: Path, db: str) -> AsyncIterator[tuple[Api, ScriptedBuilder]]:
    runtime = FakeRuntime(tmp_path)
    builder = ScriptedBuilder(runtime)
    # The tests sweep themselves, with a clock moved past a long retention. The background
    # reaper stays out of the way: its pruning query would land among the statements a test
    # captures from a hot path.
    settings = make_settings(tmp_path, db_url=db, retention_seconds=600,
                             reaper_interval_seconds=3600)
    async with running_app(settings, runtime, builder=builder) as api:
        yield api, builder


async def finished(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    r = await api.client.post("/v1/templates", json=body)
    assert r.status_code == 202, r.text
    build_id = r.json()["build_id"]
    for _ in range(500):
        r = await api.client.get(f"/v1/templates/builds/{build_id}")
        assert r.status_code == 200, r.text
        if r.json()["status"] != "building":
            data: dict[str, Any] = r.json()
            return data
        await asyncio.sleep(0.01)
    raise AssertionError(f"build {build_id} never finished")


#: The template tables (not team_quotas.max_template_gb, read by every create's check).
TEMPLATE_TABLES = re.compile(r"\btemplate_(versions|blobs|names)\b")


@contextmanager
def captured_sql(engine: Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


def engine_of(api: Api) -> Engine:
    engine: Engine = api.app.state.store.engine
    return engine


async def test_hot_paths_never_read_the_spec_or_logs(env: tuple[Api, ScriptedBuilder]) -> None:
    api, _ = env
    ready = await finished(api, {"name": "app", "spec": copy_spec()})
    assert ready["status"] == "ready"
    await finished(api, {"name": "app", "spec": FAILING})
    deleted = await finished(api, {"name": "gone", "spec": SPEC})
    assert (await api.client.delete("/v1/templates/gone")).status_code == 204

    with captured_sql(engine_of(api)) as statements:
        r = await api.client.get("/v1/templates")
        assert [(t["name"], t["version"]) for t in r.json()["templates"]] == [("app", 2)]
        r = await api.client.get("/v1/templates/app")
        assert [v["status"] for v in r.json()["versions"]] == ["ready", "failed"]
        r = await api.client.get(f"/v1/templates/builds/{ready['build_id']}")
        assert r.json()["status"] == "ready"
        assert (await api.client.get(f"/v1/templates/builds/{deleted['build_id']}")
                ).status_code == 404
        for ref in ("app:1", "app"):
            r = await api.client.post("/v1/sandboxes", json={"template": ref})
            assert r.status_code == 201, (ref, r.text)
    reads = [s for s in statements if TEMPLATE_TABLES.search(s)]
    assert reads, statements
    for sql in reads:
        assert not re.search(r"\b(spec|logs)\b", sql), sql
        assert "template_blobs" not in sql, sql
        # Deleted rows are left out by the database, not loaded and dropped in Python.
        assert "deleted_at IS NULL" in sql, sql

    # The stored spec keeps what was built, not the files' bodies (only size and digest).
    with engine_of(api).connect() as conn:
        stored = conn.execute(text("SELECT spec FROM template_blobs WHERE build_id = :id"),
                              {"id": ready["build_id"]}).scalar_one()
    assert b"content_b64" not in str(stored).encode()
    assert hashlib.sha256(FILE).hexdigest() in str(stored)
    # The logs are still there for whoever follows them after the build.
    async with api.client.stream("GET", f"/v1/templates/builds/{ready['build_id']}/logs") as r:
        assert "built" in "".join([chunk async for chunk in r.aiter_text()])


def blob_count(api: Api) -> int:
    with engine_of(api).connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM template_blobs")).scalar_one())


async def test_dead_versions_are_pruned_and_numbers_never_repeat(
        env: tuple[Api, ScriptedBuilder]) -> None:
    api, _ = env
    service = api.app.state.service
    assert (await finished(api, {"name": "app", "spec": FAILING}))["status"] == "failed"
    assert (await finished(api, {"name": "app", "spec": SPEC}))["version"] == 2
    assert (await finished(api, {"name": "app", "spec": SPEC}))["version"] == 3
    assert (await api.client.delete("/v1/templates/app?version=3")).status_code == 204

    await sweep(service)  # within the retention: nothing goes
    r = await api.client.get("/v1/templates/app")
    assert [v["version"] for v in r.json()["versions"]] == [1, 2]

    await sweep(service, now=time.time() + 601)
    r = await api.client.get("/v1/templates/app")
    assert [v["version"] for v in r.json()["versions"]] == [2]  # failed v1 pruned
    assert blob_count(api) == 1
    # The pruned v3 was the newest: a new build still does not take its number.
    assert (await finished(api, {"name": "app", "spec": SPEC}))["version"] == 4

    assert (await api.client.delete("/v1/templates/app")).status_code == 204
    await sweep(service, now=time.time() + 601)
    assert blob_count(api) == 0
    with engine_of(api).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM template_versions")).scalar_one() == 0
    assert (await finished(api, {"name": "app", "spec": SPEC}))["version"] == 5
    r = await api.client.post("/v1/sandboxes", json={"template": "app"})
    assert r.status_code == 201 and r.json()["template"] == "app:5", r.text


async def test_template_store_calls_do_not_block_the_event_loop(
        env: tuple[Api, ScriptedBuilder]) -> None:
    """Each template query waits until a ticker on the event loop ticks (10 s at most), so the
    loop went on while the query ran: the query ran in a worker thread and nothing on the
    loop waited for it."""
    api, _ = env
    ticked = threading.Event()
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
            ticked.set()

    loop_thread = threading.get_ident()
    slow: list[tuple[str, bool, bool]] = []  # (statement, on the loop's thread, loop ticked)

    def slow_down(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if not TEMPLATE_TABLES.search(statement):  # not sandboxes.template
            return
        on_loop = threading.get_ident() == loop_thread
        ticked.clear()
        # On the loop's own thread the ticker cannot run: no use waiting for it.
        slow.append((statement, on_loop, not on_loop and ticked.wait(10)))

    task = asyncio.create_task(ticker())
    event.listen(engine_of(api), "before_cursor_execute", slow_down)
    try:
        first = await finished(api, {"name": "app", "spec": SPEC})  # start_build, final update
        assert first["status"] == "ready"
        assert (await finished(api, {"name": "child", "spec": {**SPEC, "from_template": "app"}})
                )["status"] == "ready"  # the base is resolved through the team
        assert (await api.client.get("/v1/templates")).status_code == 200
        assert (await api.client.get("/v1/templates/app")).status_code == 200
        r = await api.client.post("/v1/sandboxes", json={"template": "app"})
        assert r.status_code == 201, r.text
        async with api.client.stream("GET", f"/v1/templates/builds/{first['build_id']}/logs"
                                     ) as response:
            assert "built" in "".join([chunk async for chunk in response.aiter_text()])
        assert (await api.client.delete("/v1/templates/child")).status_code == 204
    finally:
        event.remove(engine_of(api), "before_cursor_execute", slow_down)
        stop.set()
        await task
    assert len(slow) >= 8, slow
    on_loop = [sql for sql, on_loop_thread, _ in slow if on_loop_thread]
    assert on_loop == [], on_loop
    stalled = [sql for sql, _, loop_ticked in slow if not loop_ticked]
    assert stalled == [], stalled
