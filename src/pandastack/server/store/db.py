"""Engine creation and programmatic alembic migrations (applied on every open)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import StaticPool

from .repo import Store

MIGRATIONS = "pandastack.server.store:migrations"
# Any constant: held while a server migrates, so that servers starting together on one
# PostgreSQL database migrate one after the other (SQLite's write lock does that by itself).
_MIGRATION_LOCK = 0x70616E64


def normal_dsn(dsn: str) -> str:
    """`postgresql://` (SQLAlchemy's default driver would be psycopg2) means psycopg 3."""
    url = make_url(dsn)
    if url.drivername == "postgresql":
        return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return dsn


def make_engine(dsn: str) -> Engine:
    dsn = normal_dsn(dsn)
    if dsn.startswith("sqlite"):
        path = dsn.split(":///", 1)[1] if ":///" in dsn else ""
        args: dict[str, Any] = {"check_same_thread": False, "timeout": 30}
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(dsn, connect_args=args)
        else:  # one connection for every thread: store calls run in worker threads
            engine = create_engine(dsn, connect_args=args, poolclass=StaticPool)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: object, _record: object) -> None:
            cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
            cur.execute("PRAGMA journal_mode=WAL")
            # With WAL, NORMAL keeps the database consistent after a crash and only skips the
            # fsync per commit (a power cut may lose the last commits, not corrupt the file).
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # A database that does not answer must fail a request in seconds, not hang it (and the
    # event loop of an API server, whose store calls are short and made inline).
    return create_engine(dsn, pool_pre_ping=True, connect_args={"connect_timeout": 5})


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def open_store(dsn: str) -> Store:
    engine = make_engine(dsn)
    migrate(engine)
    return Store(engine)
