"""`pandastack backup db FILE`: a consistent copy of the control plane's database while
the servers keep running; `pandastack backup objects DIR`: a copy of the object store
(host/objects/backup.py; `pandastack restore objects DIR` puts it back). docs/backup.md.

SQLite: the online backup API (sqlite3.Connection.backup) copies the database page by page
under its own read transaction, so writers of a running `serve` neither stop nor leave a
torn copy (copying the file with cp can: its WAL holds the newest pages). PostgreSQL:
`pg_dump --format=custom`, restored with `pg_restore`; the password goes to pg_dump in its
environment (PGPASSWORD), not on a command line `ps` shows."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import sqlite3
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from pandastack.cli.env_file import add_env_file_option, load_env_file

if TYPE_CHECKING:
    from pandastack.host.objects.config import ObjectStoreConfig
    from pandastack.host.objects.store import ObjectStore

T = TypeVar("T")

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backup", help="back up the control plane's database or the object store")
    what = p.add_subparsers(dest="what", required=True)
    db = what.add_parser("db", help="copy the database to FILE while the servers run "
                                    "(SQLite's online backup, or pg_dump for PostgreSQL)")
    db.add_argument("file", type=Path, help="where the copy goes (not overwritten)")
    add_db_option(db)
    db.add_argument("--print", action="store_true", dest="print_only",
                    help="PostgreSQL: print the pg_dump command instead of running it")
    add_env_file_option(db)
    objects = what.add_parser("objects", help="copy the object store (snapshots, hibernations, "
                                              "volume and template images) into DIR; again "
                                              "into the same DIR, only what is new is fetched")
    objects.add_argument("dir", type=Path, help="the backup directory (made mode 0700)")
    add_store_option(objects)


def add_db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, metavar="URL",
                   help="the database (default: PANDASTACK_DB, else SQLite in "
                        "PANDASTACK_HOME, as serve opens it)")


def database_url(given: str | None) -> str:
    """The database `--db` names, else the one `serve` opens (Settings: PANDASTACK_DB, else
    SQLite in PANDASTACK_HOME)."""
    from pandastack.server.settings import Settings

    return given or Settings.from_env().dsn


def add_store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, metavar="URL",
                   help="the object store (default: PANDASTACK_OBJECT_STORE, as the agents "
                        "read it; credentials from PANDASTACK_S3_ACCESS_KEY/_SECRET_KEY)")
    add_env_file_option(p)


def store_config(url: str | None) -> ObjectStoreConfig:
    from pandastack.host.objects.config import OBJECT_STORE_ENV, ObjectStoreConfig

    if url is not None:
        return ObjectStoreConfig.from_url(url)
    config = ObjectStoreConfig.from_env()
    if config is None:
        raise ValueError(f"no object store: set {OBJECT_STORE_ENV} (as the agents have it) "
                         "or give --store s3://BUCKET/...")
    return config


def on_backup_store(directory: Path, url: str | None,
                    work: Callable[[ObjectStore], Awaitable[T]]) -> T:
    """`work(store)` run to its end on the store `url` names (store_config) whose cache is
    the backup directory's, closed after: what `backup objects` and `restore objects` share."""
    from pandastack.host.objects.backup import backup_store

    async def run() -> T:
        store = backup_store(directory, store_config(url))
        try:
            return await work(store)
        finally:
            await store.close()
    return asyncio.run(run())


def backup_objects(directory: Path, url: str | None) -> int:
    from pandastack.host.objects import backup

    counts = on_backup_store(directory, url, lambda store: backup.backup_objects(
        store, directory, say=console.log))
    console.print(f"backed up {counts.objects} objects ({counts.fetched} fetched, the others "
                  f"already in {directory}) and {counts.manifests} manifests")
    if counts.missing:
        console.print(f"[yellow]warning:[/yellow] {len(counts.missing)} objects that manifests "
                      f"name were not in the store: {', '.join(counts.missing[:5])}")
    return 0


def run(args: argparse.Namespace) -> int:
    load_env_file(args.env_file)
    if args.what == "objects":
        return backup_objects(args.dir, args.store)
    dsn = database_url(args.db)
    target: Path = args.file
    if target.exists():
        raise ValueError(f"{target} exists: a backup never overwrites a file")
    if dsn.startswith("sqlite"):
        backup_sqlite(sqlite_path(dsn), target)
    elif dsn.startswith("postgresql"):
        command, env = pg_dump_command(dsn, target)
        if args.print_only:
            print(shlex.join(command))
            return 0
        if shutil.which(command[0]) is None:
            raise ValueError("pg_dump is not installed (Debian: apt-get install "
                             "postgresql-client)")
        proc = subprocess.run(command, env={**os.environ, **env}, stderr=subprocess.PIPE,
                              text=True, check=False)
        if proc.returncode != 0:
            target.unlink(missing_ok=True)
            raise ValueError(f"pg_dump failed ({proc.returncode}): {proc.stderr.strip()}")
    else:
        raise ValueError(f"cannot back up {dsn.split(':', 1)[0]} databases")
    console.print(f"backed up to {target} ({target.stat().st_size} bytes)")
    return 0


def sqlite_path(dsn: str) -> Path:
    from sqlalchemy.engine import make_url

    database = make_url(dsn).database
    if not database or database == ":memory:":
        raise ValueError(f"{dsn} names no database file")
    path = Path(database)
    if not path.is_file():
        raise ValueError(f"no database at {path}")
    return path


def backup_sqlite(source: Path, target: Path) -> None:
    """Page by page, under SQLite's own locking; a target left half written by an error is
    removed."""
    # Read-only: a backup must not create a missing database or take a writer's lock.
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        src.close()


def pg_dump_command(dsn: str, target: Path) -> tuple[list[str], dict[str, str]]:
    """pg_dump's argv (the URL without its password and driver) and its environment."""
    url, env = pg_url(dsn)
    return ["pg_dump", "--format=custom", "--no-owner", f"--file={target}", url], env


def pg_url(dsn: str) -> tuple[str, dict[str, str]]:
    """The URL libpq's tools take on their command line (no password, no driver) and the
    environment that carries the password (PGPASSWORD)."""
    from sqlalchemy.engine import URL, make_url

    url = make_url(dsn)
    env = {"PGPASSWORD": url.password} if url.password else {}
    # URL.set(password=None) keeps the password: a new URL without one.
    plain = URL.create("postgresql", username=url.username, host=url.host, port=url.port,
                       database=url.database, query=url.query)
    return plain.render_as_string(hide_password=False), env
