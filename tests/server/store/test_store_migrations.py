"""Schema migrations on real SQLite and a real PostgreSQL (the `db` fixture): a database made
by an older revision, with the data an old server wrote, upgrades to the newest revision on
open with that data carried over; every revision downgrades and upgrades again; the models
and the migrations describe the same schema."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from pandastack.server.store import Store, TemplateVersion, open_store
from pandastack.server.store.db import MIGRATIONS, head_revision, make_engine, migrate
from pandastack.server.store.models import Base
from tests.services import Postgres

FAT_BYTES = 50 << 20


def migrate_to(dsn: str, revision: str, *, down: bool = False) -> None:
    engine = make_engine(dsn)
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
    engine.dispose()


def upgrade_to(dsn: str, revision: str) -> None:
    migrate_to(dsn, revision)


def replayed_store(dsn: str) -> Store:
    """A store whose schema every migration made, one after the other (open_store makes an
    empty database's from the models instead)."""
    engine = make_engine(dsn)
    migrate(engine, replay=True)
    return Store(engine)


def tables(dsn: str) -> set[str]:
    engine = make_engine(dsn)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def old_row(conn: object, build_id: str, version: int, status: str, spec: str,
            logs: str | None, finished_at: float | None, deleted_at: float | None) -> None:
    conn.execute(  # type: ignore[attr-defined]
        text("INSERT INTO template_versions (id, team, name, version, status, spec, env, logs, "
             "created_at, finished_at, deleted_at) VALUES (:id, 't', 'app', :version, :status, "
             ":spec, '{}', :logs, :created_at, :finished_at, :deleted_at)"),
        {"id": build_id, "version": version, "status": status, "spec": spec, "logs": logs,
         "created_at": 1000.0 + version, "finished_at": finished_at, "deleted_at": deleted_at})


def test_upgrade_moves_spec_and_logs_out_of_the_version_rows(db: str) -> None:
    dsn = db
    upgrade_to(dsn, "0004")
    fat_spec = json.dumps({"from_template": "base", "steps": [{"kind": "copy", "dst": "/srv",
                           "files": [{"path": "big", "mode": 420,
                                      "content_b64": "QUFB" * (FAT_BYTES // 4)}]}]})
    logs = "step 1/1 COPY\n" * 1000
    engine = make_engine(dsn)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, created_at) VALUES ('t', 1.0)"))
        old_row(conn, "tb-000000000001", 1, "ready", fat_spec, logs, 1100.0, None)
        old_row(conn, "tb-000000000002", 2, "failed", '{"steps": []}', "boom", 1200.0, None)
        old_row(conn, "tb-000000000003", 3, "ready", '{"steps": []}', None, 1300.0, 1400.0)
    engine.dispose()

    store = open_store(dsn)
    try:
        schema = inspect(store.engine)
        columns = {c["name"] for c in schema.get_columns("template_versions")}
        assert not columns & {"spec", "logs"}, columns
        # The table was recreated without them: its constraint and index came along.
        assert "uq_template_versions_version" in {
            c["name"] for c in schema.get_unique_constraints("template_versions")}
        assert "ix_template_versions_team_name" in {
            i["name"] for i in schema.get_indexes("template_versions")}
        with store.engine.connect() as conn:
            spec, = conn.execute(text("SELECT CAST(spec AS TEXT) FROM template_blobs "
                                      "WHERE build_id = 'tb-000000000001'")).one()
        assert len(spec) == len(fat_spec) and json.loads(spec) == json.loads(fat_spec)
        assert store.template_build_logs("t", "tb-000000000001") == logs
        assert store.template_build_logs("t", "tb-000000000002") == "boom"
        assert store.template_build_logs("other", "tb-000000000001") is None
        assert [r.version for r in store.template_versions("t", "app")] == [1, 2]

        # The failed v2 and the deleted v3 are dead: pruned with their blobs; v3 was the
        # newest, and its number stays taken.
        assert store.purge_template_versions(before=time.time()) == 2
        with store.engine.connect() as conn:
            blobs = conn.execute(text("SELECT build_id FROM template_blobs")).scalars().all()
        assert blobs == ["tb-000000000001"]
        row = TemplateVersion(id="tb-000000000004", team="t", name="app", version=0,
                              status="building", env={}, created_at=time.time())
        assert store.add_template_version(row, {"steps": []}).version == 4
    finally:
        store.close()


def test_what_held_resources_across_0009_is_metered_from_0010(db: str) -> None:
    upgrade_to(db, "0009")
    engine = make_engine(db)
    sandbox = ("INSERT INTO sandboxes (id, team, template, state, created_at, ttl_seconds, "
               "persistent, vcpus, memory_mb, disk_mb, env, metadata, last_activity_at) VALUES "
               "(:id, 't', 'base', :state, 1.0, 60, false, 2, 1024, :disk, '{}', '{}', 1.0)")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, created_at) VALUES ('t', 1.0)"))
        for sid, state, disk in (("sbx-run", "running", None), ("sbx-sleep", "hibernated", 4096),
                                 ("sbx-gone", "killed", None), ("sbx-new", "running", None)):
            conn.execute(text(sandbox), {"id": sid, "state": state, "disk": disk})
        # One started under 0009's code: metered already, it must not be metered twice.
        conn.execute(text("INSERT INTO usage_segments (team, kind, subject_id, sandbox_id, "
                          "template, vcpus, memory_mb, gib, started_at) VALUES ('t', :kind, "
                          "'sbx-new', 'sbx-new', 'base', 2, 1024, 2.0, 5.0)"),
                     [{"kind": "compute"}, {"kind": "disk"}])
        conn.execute(text("INSERT INTO volumes (id, team, name, size_mb, created_at) VALUES "
                          "('vol-1', 't', 'data', 2048, 1.0)"))
        conn.execute(text("INSERT INTO snapshots (id, team, template, created_at, vcpus, "
                          "memory_mb, size_bytes, volumes) VALUES ('snap-1', 't', 'base', 1.0, "
                          "1, 512, 1073741824, '[]')"))
    engine.dispose()
    before = time.time()
    open_store(db).close()
    engine = make_engine(db)
    with engine.connect() as conn:
        got = conn.execute(text("SELECT subject_id, kind, vcpus, gib, started_at FROM "
                                "usage_segments WHERE ended_at IS NULL ORDER BY subject_id, "
                                "kind")).all()
    engine.dispose()
    assert [(r[0], r[1], r[2], r[3]) for r in got] == [
        ("sbx-new", "compute", 2, 2.0), ("sbx-new", "disk", 2, 2.0),
        ("sbx-run", "compute", 2, 0.0), ("sbx-run", "disk", 0, 2.0),
        ("sbx-sleep", "disk", 0, 4.0), ("snap-1", "snapshot", 0, 1.0),
        ("vol-1", "volume", 0, 2.0)]
    assert all(r[4] >= before for r in got if r[0] != "sbx-new")


def test_every_revision_downgrades_and_upgrades_again(db: str) -> None:
    store = replayed_store(db)
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO teams (id, created_at) VALUES ('t', 1.0)"))
        conn.execute(text(
            "INSERT INTO sandboxes (id, team, template, state, created_at, ttl_seconds, "
            "persistent, vcpus, memory_mb, env, metadata, last_activity_at, host_id) VALUES "
            "('sbx-1', 't', 'base', 'running', 1.0, 60, false, 1, 256, '{}', '{}', 1.0, "
            "'host-1')"))
    store.close()
    everything = tables(db)
    assert {"hosts", "leases", "sandboxes", "template_blobs"} <= everything, everything

    migrate_to(db, "0005", down=True)
    assert tables(db) <= everything - {"hosts", "leases", "volumes", "volume_attachments"}
    assert {"sandboxes", "snapshots", "template_blobs"} <= tables(db)
    engine = make_engine(db)
    with engine.connect() as conn:  # the older columns and their data are kept
        assert "host_id" not in {c["name"] for c in inspect(conn).get_columns("sandboxes")}
        assert conn.execute(text("SELECT state FROM sandboxes")).scalars().all() == ["running"]
    engine.dispose()

    migrate_to(db, "base", down=True)
    assert tables(db) == {"alembic_version"}
    store = open_store(db)
    try:
        assert tables(db) == everything
        assert store.list_sandboxes("t") == []
    finally:
        store.close()


def test_the_models_are_the_schema_the_migrations_make(db: str) -> None:
    store = replayed_store(db)
    try:
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        store.close()


def schema(dsn: str) -> dict[str, object]:
    """Every table's columns (name, type, nullability; their order aside), indexes, unique
    constraints, primary and foreign keys, as the database itself describes them."""
    engine = make_engine(dsn)
    try:
        look = inspect(engine)
        return {table: (
            sorted((c["name"], str(c["type"]), c["nullable"]) for c in look.get_columns(table)),
            sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                   for i in look.get_indexes(table)),
            sorted(tuple(u["column_names"]) for u in look.get_unique_constraints(table)),
            look.get_pk_constraint(table)["constrained_columns"],
            sorted((tuple(f["constrained_columns"]), f["referred_table"],
                    tuple(f["referred_columns"])) for f in look.get_foreign_keys(table)),
        ) for table in sorted(look.get_table_names())}
    finally:
        engine.dispose()


def server_defaults(dsn: str) -> set[tuple[str, str, str]]:
    engine = make_engine(dsn)
    try:
        look = inspect(engine)
        return {(table, c["name"], str(c["default"])) for table in look.get_table_names()
                for c in look.get_columns(table) if c.get("default") is not None}
    finally:
        engine.dispose()


def test_an_empty_database_made_from_the_models_is_the_one_the_migrations_make(
        db: str, tmp_path: Path, postgres: Postgres) -> None:
    """open_store's fast path for an empty database (the models, stamped at the newest
    revision) against every migration replayed, compared as each database describes it.
    Server defaults: the models' must be the migrations' too; the migrations may keep more
    (SQLite keeps those that filled the rows of a column added to a table, e.g. hosts'
    counters), which no insert needs, since every insert goes through the models and they
    give each such column its value."""
    open_store(db).close()
    made = schema(db)
    with contextlib.ExitStack() as stack:
        if db.startswith("sqlite"):
            other = f"sqlite:///{tmp_path / 'replayed.db'}"
        else:
            other = stack.enter_context(postgres.database())
        replayed_store(other).close()
        assert schema(other) == made
        assert server_defaults(db) <= server_defaults(other)
    engine = make_engine(db)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() \
            == [head_revision()]
    engine.dispose()


def test_the_head_revision_is_alembics_own() -> None:
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    assert [head_revision()] == list(ScriptDirectory.from_config(cfg).get_heads())


def test_a_database_at_the_newest_revision_opens_without_loading_alembic(db: str) -> None:
    open_store(db).close()
    code = ("import sys; from pandastack.server.store import open_store; "
            f"open_store({db!r}).close(); print(sorted(m for m in sys.modules "
            "if m == 'alembic' or m.startswith('alembic.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


def test_servers_starting_together_on_postgresql_migrate_one_after_the_other(
        postgres: Postgres) -> None:
    with postgres.database() as dsn:
        start = threading.Barrier(4)
        opened: list[Store] = []
        failed: list[BaseException] = []

        def open_one() -> None:
            start.wait()
            try:
                opened.append(open_store(dsn))
            except BaseException as e:  # reported below, from the test's thread
                failed.append(e)

        threads = [threading.Thread(target=open_one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for store in opened:
            store.close()
        assert failed == [] and len(opened) == 4


def test_a_plain_postgresql_dsn_means_psycopg_3(postgres: Postgres) -> None:
    with postgres.database() as dsn:
        store = open_store(dsn.replace("postgresql+psycopg://", "postgresql://"))
        try:
            assert store.engine.dialect.driver == "psycopg"
            assert store.list_keys() == []
        finally:
            store.close()
