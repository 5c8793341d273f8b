"""`pandastack backup db FILE`: a consistent copy of the control plane's database while
the servers keep running (docs/operations.md, "Backups").

SQLite: the online backup API (sqlite3.Connection.backup) copies the database page by page
under its own read transaction, so writers of a running `serve` neither stop nor leave a
torn copy (copying the file with cp can: its WAL holds the newest pages). PostgreSQL:
`pg_dump --format=custom`, restored with `pg_restore`; the password goes to pg_dump in its
environment (PGPASSWORD), not on a command line `ps` shows."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path

from rich.console import Console

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("backup", help="back up the control plane's database")
    what = p.add_subparsers(dest="what", required=True)
    db = what.add_parser("db", help="copy the database to FILE while the servers run "
                                    "(SQLite's online backup, or pg_dump for PostgreSQL)")
    db.add_argument("file", type=Path, help="where the copy goes (not overwritten)")
    db.add_argument("--db", default=None, metavar="URL",
                    help="the database (default: PANDASTACK_DB, else SQLite in "
                         "PANDASTACK_HOME, as serve opens it)")
    db.add_argument("--print", action="store_true", dest="print_only",
                    help="PostgreSQL: print the pg_dump command instead of running it")


def run(args: argparse.Namespace) -> int:
    from pandastack.server.settings import Settings

    dsn = args.db or Settings.from_env().dsn
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
    from sqlalchemy.engine import URL, make_url

    url = make_url(dsn)
    env = {"PGPASSWORD": url.password} if url.password else {}
    # URL.set(password=None) keeps the password: a new URL without one.
    plain = URL.create("postgresql", username=url.username, host=url.host, port=url.port,
                       database=url.database, query=url.query)
    return (["pg_dump", "--format=custom", "--no-owner", f"--file={target}",
             plain.render_as_string(hide_password=False)], env)
