"""`pandastack restore db BACKUP`: puts a `pandastack backup db` copy back in place of the
database `serve` uses, then migrates it to this release (docs/backup.md).

SQLite: refused while any process has the database open. Every connection `serve` makes is
in WAL mode (server/store/db.py) and holds a POSIX read lock on the -shm file for as long as
it is open, which the kernel shows to anyone who asks (F_GETLK). (Asking SQLite to leave WAL
mode is not enough alone: POSIX locks are per process, so a process that opens and closes
the database file by other means while a connection of its own has it open drops that
connection's lock on it, as tests saw with two apps run one after the other in one process;
only SQLite opens the -shm file.) Then journal_mode=DELETE, which SQLite switches to only
under an exclusive lock, folds the WAL's last pages into the file, which is kept whole.
The copy is made beside the database (SQLite's backup API, so a copy with a -wal of its own
is read whole), fsynced, the old file hard-linked as `<db>.before-restore`, and
renamed over the database: at every moment the path holds one database or the other.

PostgreSQL: refused while other sessions are connected to the database (pg_stat_activity:
API servers, agents started with --db) and, unless --force-clean, when it holds any table;
--force-clean drops its tables, views and sequences first. `pg_restore --single-transaction`
then restores all of the dump or nothing."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console

from pandastack.cli.backup import backup_sqlite, pg_url
from pandastack.host.images.common import fsync_path

console = Console(stderr=True)

SQLITE_MAGIC = b"SQLite format 3\x00"
PGDUMP_MAGIC = b"PGDMP"  # pg_dump's custom format, the one `backup db` writes
BEFORE = ".before-restore"
BUSY_SECONDS = 1.0  # how long a lock held by someone else may take to go before we refuse


def restore(backup: Path, dsn: str, *, force_clean: bool = False) -> None:
    if not backup.is_file():
        raise ValueError(f"no backup at {backup}")
    if dsn.startswith("sqlite"):
        database = sqlite_database(dsn)
        before = restore_sqlite(backup, database)
        revision = migrate(dsn)
        kept = f"; the previous database is {before}" if before else ""
        console.print(f"restored {backup} into {database}, migrated to {revision}{kept}")
    elif dsn.startswith("postgresql"):
        restore_postgresql(backup, dsn, force_clean=force_clean)
        revision = migrate(dsn)
        console.print(f"restored {backup} into {pg_url(dsn)[0]}, migrated to {revision}")
    else:
        raise ValueError(f"cannot restore {dsn.split(':', 1)[0]} databases")


def migrate(dsn: str) -> str:
    from pandastack.server.store.db import head_revision, make_engine
    from pandastack.server.store.db import migrate as to_head

    engine = make_engine(dsn)
    try:
        to_head(engine)
    finally:
        engine.dispose()
    return head_revision()


def check_revision(revision: str | None, backup: Path) -> None:
    """A backup this release's migrations cannot bring up: none, or one from a newer
    release (downgrading is not done here)."""
    from pandastack.server.store.db import head_revision

    if revision is None:
        raise ValueError(f"{backup} is not a pandastack database (no alembic_version row)")
    head = head_revision()
    if revision > head:
        raise ValueError(f"{backup} is at schema revision {revision}, newer than this "
                         f"release's {head}: restore it with the release that made it")


# SQLite


def sqlite_database(dsn: str) -> Path:
    from sqlalchemy.engine import make_url

    database = make_url(dsn).database
    if not database or database == ":memory:":
        raise ValueError(f"{dsn} names no database file")
    path = Path(database)
    if not path.parent.is_dir():
        raise ValueError(f"no directory {path.parent} for the database")
    return path


def restore_sqlite(backup: Path, database: Path) -> Path | None:
    """The backup in place of `database`; the previous file's new name, if there was one."""
    check_sqlite_backup(backup)
    before = database.with_name(database.name + BEFORE)
    if database.exists():
        if before.exists():
            raise ValueError(f"{before} is there from an earlier restore: move it away first")
        release_wal(database)
    fd, name = tempfile.mkstemp(prefix=f".{database.name}.restore-", dir=database.parent)
    os.close(fd)
    staged, linked = Path(name), False
    try:
        copy_sqlite(backup, staged)
        if database.exists():
            keep_owner(database, staged)
            os.link(database, before)
            linked = True
        # The old file's WAL and index are gone with journal_mode=DELETE; any left would be
        # read into the new file by the next opener.
        for suffix in ("-wal", "-shm", "-journal"):
            database.with_name(database.name + suffix).unlink(missing_ok=True)
        os.replace(staged, database)
    except BaseException:
        staged.unlink(missing_ok=True)
        if linked:  # the database is still the old file: no second name for it
            before.unlink()
        raise
    fsync_path(database.parent)
    return before if linked else None


def release_wal(database: Path) -> None:
    """Refuses when another process has `database` open; otherwise leaves it one file."""
    for path in (database, database.with_name(database.name + "-shm")):
        pid = locked_by(path)
        if pid is not None:
            raise in_use(database, f"pid {pid} holds a lock on {path.name}")
    conn = sqlite3.connect(f"file:{database}?mode=rw", uri=True, timeout=BUSY_SECONDS)
    try:
        mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
    except sqlite3.OperationalError as exc:
        raise in_use(database, str(exc)) from None
    finally:
        conn.close()
    if str(mode).lower() != "delete":
        raise in_use(database, f"it stayed in journal mode {mode}")


def locked_by(path: Path) -> int | None:
    """The pid of another process holding a POSIX lock on `path`, if one does. SQLite locks
    with them: a connection in WAL mode holds a read lock on its -shm file's byte 128 for as
    long as it is open (how SQLite tells it is the last), and the database file's shared
    range while it reads."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        # struct flock: l_type, l_whence, l_start, l_len (0: to the end), l_pid.
        probe = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        l_type, _, _, _, pid = struct.unpack("@hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    finally:
        os.close(fd)
    return None if l_type == fcntl.F_UNLCK else int(pid)


def in_use(database: Path, why: str) -> ValueError:
    return ValueError(f"{database} is in use ({why}){holders_text(database)}: stop `serve` "
                      "(systemctl stop pandastack-serve) and run this again")


def holders_text(database: Path) -> str:
    """`: pid N (command), ...` of the processes this user may see holding the database."""
    names = {str(database.resolve()) + s for s in ("", "-wal", "-shm")}
    found: list[str] = []
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name == str(os.getpid()):
            continue
        try:
            if any(os.readlink(fd) in names for fd in (proc / "fd").iterdir()):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found.append(f"pid {proc.name} ({cmd[:80]})")
        except OSError:  # gone, or another user's
            continue
    return (": held by " + ", ".join(found)) if found else ""


def check_sqlite_backup(backup: Path) -> None:
    """A whole SQLite database of a schema this release can migrate, else ValueError."""
    with backup.open("rb") as f:
        if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise ValueError(f"{backup} is not a SQLite database")
    conn = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
    try:
        if conn.execute("PRAGMA quick_check").fetchone() != ("ok",):
            raise ValueError(f"{backup} is damaged (PRAGMA quick_check)")
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.OperationalError:
            row = None
    finally:
        conn.close()
    check_revision(row[0] if row else None, backup)


def copy_sqlite(backup: Path, staged: Path) -> None:
    """SQLite's backup API, as `backup db` copies (a backup with a -wal beside it is read
    whole), then fsync."""
    backup_sqlite(backup, staged)
    fsync_path(staged)


def keep_owner(database: Path, staged: Path) -> None:
    st = database.stat()
    os.chmod(staged, st.st_mode & 0o777)
    if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
        os.chown(staged, st.st_uid, st.st_gid)


# PostgreSQL


def restore_postgresql(backup: Path, dsn: str, *, force_clean: bool) -> None:
    with backup.open("rb") as f:
        if f.read(len(PGDUMP_MAGIC)) != PGDUMP_MAGIC:
            raise ValueError(f"{backup} is not a pg_dump archive (custom format, as "
                             "`pandastack backup db --db postgresql://...` writes)")
    if shutil.which("pg_restore") is None:
        raise ValueError("pg_restore is not installed (Debian: apt-get install "
                         "postgresql-client)")
    url, env = pg_url(dsn)
    env = {**os.environ, **env}
    check_revision(dump_revision(backup, env), backup)
    prepare_database(dsn, url, force_clean=force_clean)
    proc = subprocess.run(["pg_restore", "--no-owner", "--exit-on-error",
                           "--single-transaction", "--dbname", url, str(backup)],
                          env=env, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise ValueError(f"pg_restore failed ({proc.returncode}), nothing restored: "
                         f"{proc.stderr.strip()}")


def dump_revision(backup: Path, env: dict[str, str]) -> str | None:
    """The alembic_version row in the dump, read by pg_restore without a database."""
    proc = subprocess.run(["pg_restore", "--data-only", "--table=alembic_version",
                           "--file=-", str(backup)], env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise ValueError(f"pg_restore cannot read {backup}: {proc.stderr.strip()}")
    rows = re.search(r"^COPY \S*alembic_version .*?;\n(.*?)^\\\.$", proc.stdout,
                     re.MULTILINE | re.DOTALL)
    return (rows.group(1).strip() or None) if rows else None


def prepare_database(dsn: str, url: str, *, force_clean: bool) -> None:
    """Refuses a database others are connected to, or one with tables (unless
    `force_clean`: then drops them)."""
    from sqlalchemy import text

    from pandastack.server.store.db import make_engine

    engine = make_engine(dsn)
    try:
        with engine.begin() as conn:
            others = conn.execute(text(
                "SELECT pid, coalesce(application_name, ''), coalesce(host(client_addr), "
                "'local') FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")).all()
            if others:
                who = ", ".join(f"pid {pid} from {addr}" + (f" ({app})" if app else "")
                                for pid, app, addr in others)
                raise ValueError(f"{len(others)} other sessions are connected to {url} ({who}):"
                                 " stop every API server (and agent started with --db) first")
            relations = conn.execute(text(
                "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
                "AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%' "
                "AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')")).all()
            tables = [f"{s}.{n}" for s, n, kind in relations if kind in ("r", "p")]
            if relations and not force_clean:
                raise ValueError(
                    f"{url} is not empty ({len(tables)} tables: {', '.join(tables[:5])}"
                    f"{', ...' if len(tables) > 5 else ''}): a restore needs an empty database."
                    " Restore into a new one (createdb), or give --force-clean to drop every "
                    "table, view and sequence in it first")
            kinds = {"v": "VIEW", "m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE"}
            # Views first, sequences last: a table's own sequence goes with it (IF EXISTS).
            for schema, name, kind in sorted(relations, key=lambda r: "vmfrpS".index(r[2])):
                what = kinds.get(kind, "SEQUENCE" if kind == "S" else "TABLE")
                conn.execute(text(f"DROP {what} IF EXISTS {quoted(schema)}.{quoted(name)} "
                                  "CASCADE"))
    finally:
        engine.dispose()


def quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
