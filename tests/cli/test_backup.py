"""`pandastack backup db`: an online copy of the control plane's database, and what a server
started on an older copy does with the sandboxes its hosts run (docs/operations.md,
"Backups"; ADR 0047, addendum): rows the backup has and the host still runs are adopted,
rows whose VM is gone since fail, and sandboxes created after the backup are left running
and reported, not killed. PostgreSQL through pg_dump with the session's server."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from pandastack.cli.backup import pg_dump_command
from pandastack.host.file_modes import SERVICE_UMASK
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.services import Postgres


def backup(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pandastack", "backup", "db", *args],
                          text=True, capture_output=True, timeout=120)


async def created(api: Api) -> str:
    r = await api.client.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def test_restore_an_older_sqlite_backup(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    db = tmp_path / "pandastack.db"
    copy = tmp_path / "backups" / "before.db"
    copy.parent.mkdir()
    runtime = FakeRuntime(tmp_path / "rt")
    async with running_app(settings, runtime) as api:
        kept = await created(api)
        killed_since = await created(api)
        # Online: the server is up and its database open while the copy is taken.
        proc = backup(str(copy), "--db", settings.dsn)
        assert proc.returncode == 0, proc.stderr
        made_since = await created(api)
        assert (await api.client.delete(f"/v1/sandboxes/{killed_since}")).status_code == 204
        # A backup never overwrites: a second one to the same file fails and leaves it.
        again = backup(str(copy), "--db", settings.dsn)
        assert again.returncode == 1 and "exists" in again.stderr

    with sqlite3.connect(copy) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        ids = {row[0] for row in conn.execute("SELECT id FROM sandboxes")}
    assert ids == {kept, killed_since}
    assert copy.stat().st_mode & 0o777 & SERVICE_UMASK == 0  # the database's secrets

    # The documented restore: the server stopped, the copy put in place of the database
    # (its -wal and -shm files removed with it), the server started.
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)
    shutil.copy2(copy, db)
    async with running_app(settings, runtime) as api:
        service = api.app.state.service
        assert (await api.client.get(f"/v1/sandboxes/{kept}")).json()["state"] == "running"
        # The backup's row says running; its VM was killed since: the host wins.
        gone = (await api.client.get(f"/v1/sandboxes/{killed_since}")).json()
        assert gone["state"] == "failed"
        assert gone["end_reason"] == "its disk is gone from the host (and it has no snapshot)"
        # Created after the backup: the database does not know it, the host keeps it running
        # and the server says so; no team can reach it through this database.
        assert made_since in runtime.sandboxes and made_since not in runtime.killed
        assert runtime.sandboxes[made_since].is_alive()
        assert service.unknown_vms == [made_since]
        assert (await api.client.get(f"/v1/sandboxes/{made_since}")).status_code == 404
        r = await api.client.post(f"/v1/sandboxes/{kept}/exec", json={"cmd": "true"})
        assert r.status_code == 200, r.text
    async with running_app(make_settings(tmp_path, kill_unknown_vms=True), runtime) as api:
        assert made_since in runtime.killed and api.app.state.service.unknown_vms == []


def test_sqlite_refusals(tmp_path: Path) -> None:
    missing = backup(str(tmp_path / "b.db"), "--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 1 and "no database at" in missing.stderr
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "b.db").exists()


async def test_postgresql_through_pg_dump(tmp_path: Path, postgres: Postgres) -> None:
    dump = tmp_path / "pandastack.dump"
    with postgres.database() as dsn, postgres.database() as restored:
        async with running_app(make_settings(tmp_path, db_url=dsn), FakeRuntime(tmp_path)) as api:
            sid = await created(api)
            printed = backup(str(dump), "--db", dsn, "--print")
            assert printed.returncode == 0, printed.stderr
            command = printed.stdout.strip()
            assert command.startswith("pg_dump --format=custom") and str(dump) in command
            password = make_url(dsn).password
            assert not password or password not in command  # PGPASSWORD carries it
            assert not dump.exists()
            proc = backup(str(dump), "--db", dsn)
            assert proc.returncode == 0, proc.stderr
        # The documented restore: pg_restore into an empty database.
        url = make_url(restored)
        env = {"PGPASSWORD": url.password} if url.password else {}
        _, argv_url = pg_dump_command(restored, dump)[0][-2:]
        restore = subprocess.run(["pg_restore", "--no-owner", "--dbname", argv_url, str(dump)],
                                 env={**os.environ, **env}, text=True, capture_output=True,
                                 timeout=120)
        assert restore.returncode == 0, restore.stderr
        engine = create_engine(restored, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT id, state FROM sandboxes")).all()
        finally:
            engine.dispose()
        assert [tuple(r) for r in rows] == [(sid, "running")]
