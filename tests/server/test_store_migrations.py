"""Schema migrations on real SQLite: a database made by an older revision, with the data an
old server wrote, upgrades to the newest revision on open with that data carried over."""

from __future__ import annotations

import json
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text

from pandastack.server.store import TemplateVersion, open_store
from pandastack.server.store.db import MIGRATIONS, make_engine

FAT_BYTES = 50 << 20


def upgrade_to(dsn: str, revision: str) -> None:
    engine = make_engine(dsn)
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    engine.dispose()


def old_row(conn: object, build_id: str, version: int, status: str, spec: str,
            logs: str | None, finished_at: float | None, deleted_at: float | None) -> None:
    conn.execute(  # type: ignore[attr-defined]
        text("INSERT INTO template_versions (id, team, name, version, status, spec, env, logs, "
             "created_at, finished_at, deleted_at) VALUES (:id, 't', 'app', :version, :status, "
             ":spec, '{}', :logs, :created_at, :finished_at, :deleted_at)"),
        {"id": build_id, "version": version, "status": status, "spec": spec, "logs": logs,
         "created_at": 1000.0 + version, "finished_at": finished_at, "deleted_at": deleted_at})


def test_upgrade_moves_spec_and_logs_out_of_the_version_rows(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'old.db'}"
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
            spec, = conn.execute(text("SELECT spec FROM template_blobs "
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
