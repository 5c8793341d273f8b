"""Server test fixtures: an app over a temp SQLite DB, driven in-process through httpx's ASGI
transport with its lifespan running; the admin key comes from the client config it writes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from pandastack.host.local import LocalHost
from pandastack.host.runtime import HostRuntime
from pandastack.hostport.protocols import RuntimePort
from pandastack.server.app import create_app
from pandastack.server.settings import Settings
from pandastack.server.store import Store, open_store
from tests.server.fakes import FakeRuntime, ScriptedBuilder
from tests.services import Postgres

#: The host port's implementations every API VM suite runs against (tests/server/vm_app.py).
HOST_MODES = ("in-process", "agent")


@pytest.fixture(scope="module", params=HOST_MODES)
def host_mode(request: pytest.FixtureRequest) -> str:
    mode: str = request.param
    return mode


#: The databases the store's suites run against (the `db` fixture; PostgreSQL is the
#: session's one server, the `postgres` fixture of tests/conftest.py).
DATABASES = ("sqlite", "postgresql")


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A DSN of an empty database: a SQLite file, or a new database on the session's
    PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'pandastack.db'}"
        return
    server: Postgres = request.getfixturevalue("postgres")
    with server.database() as dsn:
        yield dsn


@pytest.fixture
def store(db: str) -> Iterator[Store]:
    """A store opened on `db` (SQLite and PostgreSQL), closed after the test."""
    s = open_store(db)
    try:
        yield s
    finally:
        s.close()


def make_settings(tmp: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "home": Path("/var/lib/pandastack"),
        "db_url": f"sqlite:///{tmp / 'pandastack.db'}",
        "client_config_path": tmp / "client" / "config.json",
        "reaper_interval_seconds": 0.2,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


class Api:
    """A started app, its admin client, and a way to make clients with other keys."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient, admin_key: str) -> None:
        self.app = app
        self.client = client
        self.admin_key = admin_key
        # The `pandastack agent` the app drives (tests/server/live_agent.LiveAgent), if any.
        self.agent: Any = None

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.admin_key}"}

    async def new_key(self, team: str, name: str = "k") -> str:
        r = await self.client.post("/v1/keys", json={"name": name, "team": team})
        assert r.status_code == 201, r.text
        key: str = r.json()["key"]
        return key


@asynccontextmanager
async def running_app(
    settings: Settings, runtime: RuntimePort | HostRuntime | None = None,
    admin_key: str | None = None,
    builder: ScriptedBuilder | None = None,
) -> AsyncIterator[Api]:
    if builder is not None:
        assert isinstance(runtime, FakeRuntime)
        runtime.builder = builder
    if isinstance(runtime, HostRuntime):  # the test owns it, and looks inside it after
        runtime = LocalHost(runtime, owns_runtime=False)
    app = create_app(settings, runtime)
    async with app.router.lifespan_context(app):
        if admin_key is None:
            admin_key = json.loads(settings.client_config_path.read_text())["api_key"]
        assert admin_key is not None
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://test",
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=120,
        ) as client:
            yield Api(app, client, admin_key)


def assert_envelope(r: httpx.Response, status: int, code: str | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "request_id"}, body
    assert body["error"]["request_id"] == r.headers["x-request-id"]
    if code is not None:
        assert body["error"]["code"] == code, body
