"""`pandastack backup db` and `pandastack restore db`: an online copy of the control plane's
database, put back by the command, and what a server started on the older copy does with the
sandboxes its hosts run (docs/backup.md; ADR 0047, addendum): rows the backup
has and the host still runs are adopted, rows whose VM is gone since fail, and sandboxes
created after the backup are left running and reported, not killed. The restore refuses a
database a server holds, a backup of a newer schema and a second restore over the first's
`.before-restore`, and migrates an older schema. PostgreSQL through pg_dump and pg_restore
with the session's server: refused into a database with tables or with other sessions."""

from __future__ import annotations

import gc
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from pandastack.cli.restore_db import locked_by
from pandastack.host.file_modes import SERVICE_UMASK
from pandastack.server.store import open_store
from pandastack.server.store.db import head_revision
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.store.test_store_migrations import migrate_to
from tests.services import Postgres


def backup(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pandastack", "backup", "db", *args],
                          text=True, capture_output=True, timeout=120)


def restore(*args: str) -> subprocess.CompletedProcess[str]:
    """`restore db ARGS`, its message unwrapped (the console folds it at 80 columns)."""
    proc = subprocess.run([sys.executable, "-m", "pandastack", "restore", "db", *args],
                          text=True, capture_output=True, timeout=120)
    proc.stderr = " ".join(proc.stderr.split())
    return proc


def stopped(db: Path) -> None:
    """Until no process holds a lock on `db` or its -shm file, as after `serve` exits. An app
    stopped in this process may leave one connection open: a store call of its reaper's,
    still running in a worker thread when the lifespan closed the store, checks out a new
    one; the process exiting drops it in `serve`, the collector here."""
    shm = db.with_name(db.name + "-shm")
    deadline = time.monotonic() + 30
    while locked_by(db) is not None or locked_by(shm) is not None:
        assert time.monotonic() < deadline, f"{db} still held by {locked_by(db)}"
        gc.collect()
        time.sleep(0.05)


def revision(dsn: str) -> str:
    engine = create_engine(dsn, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT version_num FROM alembic_version")).scalar())
    finally:
        engine.dispose()


def previous(rev: str) -> str:
    return f"{int(rev) - 1:04d}"


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

    # The documented restore: the server stopped, `restore db` (the copy taken back a
    # revision first, as a backup of the previous release would be: the command migrates it).
    migrate_to(f"sqlite:///{copy}", previous(head_revision()), down=True)
    async with running_app(settings, runtime) as api:
        held = restore(str(copy), "--db", settings.dsn)  # a server holds the database
        assert held.returncode == 1 and "is in use" in held.stderr, held.stderr
        assert f"held by pid {os.getpid()} " in held.stderr  # this process runs the server
        assert (await api.client.get(f"/v1/sandboxes/{made_since}")).status_code == 200
    assert not db.with_name("pandastack.db.before-restore").exists()
    stopped(db)
    proc = restore(str(copy), "--db", settings.dsn)
    assert proc.returncode == 0, proc.stderr
    assert f"migrated to {head_revision()}" in proc.stderr
    assert revision(settings.dsn) == head_revision()
    assert not db.with_name("pandastack.db-wal").exists()
    assert db.stat().st_mode & 0o777 & SERVICE_UMASK == 0
    # The database it replaced is kept whole (its WAL folded in): it has the newer sandbox.
    with sqlite3.connect(db.with_name("pandastack.db.before-restore")) as conn:
        assert made_since in {row[0] for row in conn.execute("SELECT id FROM sandboxes")}
    again = restore(str(copy), "--db", settings.dsn)
    assert again.returncode == 1 and "from an earlier restore" in again.stderr

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

    target = f"sqlite:///{tmp_path / 'pandastack.db'}"
    gone = restore(str(tmp_path / "none.db"), "--db", target)
    assert gone.returncode == 1 and "no backup at" in gone.stderr
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database")
    wrong = restore(str(not_sqlite), "--db", target)
    assert wrong.returncode == 1 and "is not a SQLite database" in wrong.stderr
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('9999')")
    refused = restore(str(newer), "--db", target)
    assert refused.returncode == 1 and "newer than this release's" in refused.stderr
    assert not (tmp_path / "pandastack.db").exists()
    # Onto a host without a database yet: put in place, nothing to keep.
    open_store(f"sqlite:///{tmp_path / 'made.db'}").engine.dispose()
    fresh = restore(str(tmp_path / "made.db"), "--db", target)
    assert fresh.returncode == 0, fresh.stderr
    assert revision(target) == head_revision()
    assert not (tmp_path / "pandastack.db.before-restore").exists()


def sandbox_rows(dsn: str) -> list[tuple[str, str]]:
    engine = create_engine(dsn, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [(str(i), str(state))
                    for i, state in conn.execute(text("SELECT id, state FROM sandboxes"))]
    finally:
        engine.dispose()


async def test_postgresql_through_pg_dump(tmp_path: Path, postgres: Postgres) -> None:
    dump, older = tmp_path / "pandastack.dump", tmp_path / "older.dump"
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
            # A server holds the database: refused, even with --force-clean.
            held = restore(str(dump), "--db", dsn, "--force-clean")
            assert held.returncode == 1 and "other sessions are connected" in held.stderr
        # The documented restore: `restore db` into an empty database.
        proc = restore(str(dump), "--db", restored)
        assert proc.returncode == 0, proc.stderr
        assert sandbox_rows(restored) == [(sid, "running")]
        # Into one with tables: refused unless --force-clean, which drops them first.
        again = restore(str(dump), "--db", restored)
        assert again.returncode == 1 and "is not empty" in again.stderr
        assert "--force-clean" in again.stderr
        # A backup of the previous release's schema is migrated to this one's.
        migrate_to(dsn, previous(head_revision()), down=True)
        assert backup(str(older), "--db", dsn).returncode == 0
        clean = restore(str(older), "--db", restored, "--force-clean")
        assert clean.returncode == 0, clean.stderr
        assert revision(restored) == head_revision()
        assert sandbox_rows(restored) == [(sid, "running")]


def test_env_file_names_the_database(tmp_path: Path) -> None:
    """`--env-file` reads the units' file as systemd does: a value with spaces (the agent's
    unquoted flags) would break the shell's `set -a; . FILE` the guide used to give."""
    db, copy = tmp_path / "pandastack.db", tmp_path / "copy.db"
    open_store(f"sqlite:///{db}").engine.dispose()
    env_file = tmp_path / "pandastack.env"
    env_file.write_text(f"PANDASTACK_DB=sqlite:///{db}\n"
                        "PANDASTACK_AGENT_ARGS=--listen 127.0.0.1:7000 --label zone=a\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PANDASTACK_")}
    run = [sys.executable, "-m", "pandastack"]
    proc = subprocess.run([*run, "backup", "db", str(copy), "--env-file", str(env_file)],
                          env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert revision(f"sqlite:///{copy}") == head_revision()
    proc = subprocess.run([*run, "restore", "db", str(copy), "--env-file", str(env_file)],
                          env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert db.with_name("pandastack.db.before-restore").is_file()
    assert revision(f"sqlite:///{db}") == head_revision()
