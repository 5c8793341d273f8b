"""Engine creation and programmatic alembic migrations (applied on every open)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from .models import Base
from .repo import Store

MIGRATIONS = "pandastack.server.store:migrations"
VERSIONS = Path(__file__).parent / "migrations" / "versions"
# Alembic's own bookkeeping table, as `alembic stamp` makes it.
_ALEMBIC_VERSION = Table("alembic_version", MetaData(),
                         Column("version_num", String(32), nullable=False),
                         PrimaryKeyConstraint("version_num", name="alembic_version_pkc"))
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


def head_revision() -> str:
    """The newest migration's revision. Each migration file is named after its revision
    (`NNNN_what.py`, each one's down_revision the number before): a test checks that this
    is alembic's own head, without loading every script as alembic does."""
    return max(p.name.split("_", 1)[0] for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


def migrate(engine: Engine, *, replay: bool = False) -> None:
    """Bring the schema to the newest revision (idempotent).

    A database at the newest revision is left as it is without loading alembic (a server's
    every start). A database without any table is made from the models and stamped at the
    newest revision, as `alembic stamp` would: the same schema as replaying every migration
    (tests/server/store/test_store_migrations.py replays them, `replay=True`, and compares)
    in a fraction of the time. Any other is migrated by alembic."""
    head = head_revision()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        tables = set(inspect(conn).get_table_names())
        if "alembic_version" in tables:
            current = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            if [row[0] for row in current] == [head]:
                return
        elif not tables and not replay:
            _create_at_head(conn, head)
            return
        _upgrade(conn)


def _create_at_head(conn: Connection, head: str) -> None:
    Base.metadata.create_all(conn)
    _ALEMBIC_VERSION.create(conn)
    conn.execute(_ALEMBIC_VERSION.insert().values(version_num=head))


def _upgrade(conn: Connection) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


def open_store(dsn: str) -> Store:
    engine = make_engine(dsn)
    migrate(engine)
    return Store(engine)
