"""The SQLite database (API key hashes, the URL-signing key, env values) is 0600, with its
WAL and shared-memory files, whatever the umask of the process that starts the server."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.server.bootstrap import private_database
from tests.server.conftest import make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
def open_umask() -> Iterator[None]:
    before = os.umask(0o022)
    yield
    os.umask(before)


def modes(db: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in sorted(db.parent.glob(db.name + "*"))}


async def test_a_new_database_is_private(tmp_path: Path, open_umask: None) -> None:
    settings = make_settings(tmp_path)
    db = tmp_path / "pandastack.db"
    async with running_app(settings, FakeRuntime(tmp_path / "s")) as api:
        r = await api.client.post("/v1/sandboxes", json={"env": {"TOKEN": "secret"}})
        assert r.status_code == 201, r.text
        r = await api.client.post(f"/v1/sandboxes/{r.json()['id']}/ports/80/signed-url",
                                  json={})
        assert r.status_code == 200, r.text
        found = modes(db)
        assert {"pandastack.db", "pandastack.db-wal", "pandastack.db-shm"} <= set(found)
        assert set(found.values()) == {0o600}, found
    assert set(modes(db).values()) == {0o600}


def test_an_older_installs_database_is_made_private(tmp_path: Path, open_umask: None) -> None:
    db = tmp_path / "pandastack.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        held = sqlite3.connect(db)  # keeps -wal and -shm
        held.execute("SELECT * FROM t")
    try:
        assert set(modes(db).values()) == {0o644}
        assert private_database(f"sqlite:///{db}") == db
        assert set(modes(db).values()) == {0o600} and len(modes(db)) == 3
    finally:
        held.close()
    assert private_database("sqlite://") is None
    assert private_database("postgresql://u@localhost/db") is None
