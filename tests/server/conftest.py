"""Server test fixtures: an app over a temp SQLite DB, driven in-process through httpx's ASGI
transport with its lifespan running; the admin key comes from the client config it writes."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from pandastack.host.local import LocalHost
from pandastack.host.runtime import HostRuntime
from pandastack.hostport.protocols import RuntimePort
from pandastack.server.app import create_app
from pandastack.server.settings import Settings
from tests.server.fakes import FakeRuntime, ScriptedBuilder

#: The host port's implementations every API VM suite runs against (tests/server/vm_app.py).
HOST_MODES = ("in-process", "agent")


@pytest.fixture(scope="module", params=HOST_MODES)
def host_mode(request: pytest.FixtureRequest) -> str:
    mode: str = request.param
    return mode


PG_CLUSTER = Path(__file__).resolve().parents[2] / "scripts" / "pg-cluster"
#: The databases the store's suites run against (the `db` fixture).
DATABASES = ("sqlite", "postgresql")


class Postgres:
    """The session's private PostgreSQL server (scripts/pg-cluster)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._admin = create_engine(dsn, isolation_level="AUTOCOMMIT", poolclass=NullPool)

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new empty database for one test, dropped after it (with whatever still holds
        a connection to it)."""
        name = "t_" + secrets.token_hex(6)
        with self._admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        try:
            yield make_url(self.dsn).set(database=name).render_as_string(hide_password=False)
        finally:
            with self._admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))

    def close(self) -> None:
        self._admin.dispose()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL server of the session's own, started from Debian's binaries (`make deps`
    installs them) and removed after it. Fails, never skips, when there is none: CI must run
    the store's suites on PostgreSQL."""
    path = Path(tempfile.mkdtemp(prefix="psp-", dir="/tmp"))
    try:
        done = subprocess.run([str(PG_CLUSTER), "start", str(path)], capture_output=True,
                              text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "timed out after 180 s")
    if done.returncode != 0:
        subprocess.run([str(PG_CLUSTER), "stop", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)
        pytest.fail(f"cannot start PostgreSQL for the tests ({PG_CLUSTER.name} start): "
                    f"{done.stderr.strip()}", pytrace=False)
    server = Postgres(done.stdout.strip())
    try:
        yield server
    finally:
        server.close()
        subprocess.run([str(PG_CLUSTER), "stop", str(path)], capture_output=True, check=False)


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
