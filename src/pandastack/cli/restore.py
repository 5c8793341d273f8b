"""`pandastack restore db BACKUP`: a `pandastack backup db` copy back in place of the
database, migrated to this release (cli/restore_db.py); `pandastack restore objects DIR`: an
object store backup (`pandastack backup objects`) back into the store: the objects it lacks,
then every manifest. Nothing in the store is deleted (docs/backup.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from pandastack.cli.backup import add_db_option, add_store_option, database_url, on_backup_store
from pandastack.cli.env_file import add_env_file_option, load_env_file

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restore", help="put a database or object store backup back")
    what = p.add_subparsers(dest="what", required=True)
    db = what.add_parser("db", help="put a `backup db` copy in place of the database (serve "
                                    "stopped), then migrate it to this release")
    db.add_argument("backup", type=Path, help="the file `pandastack backup db` made")
    add_db_option(db)
    db.add_argument("--force-clean", action="store_true",
                    help="PostgreSQL: drop every table, view and sequence of a database that "
                         "is not empty before restoring into it (SQLite: the old file is kept "
                         "as DB.before-restore anyway)")
    add_env_file_option(db)
    objects = what.add_parser("objects", help="upload the backup in DIR: the objects the store "
                                              "lacks, then its manifests (over the store's)")
    objects.add_argument("dir", type=Path, help="a directory `pandastack backup objects` made")
    add_store_option(objects)


def run(args: argparse.Namespace) -> int:
    load_env_file(args.env_file)
    if args.what == "db":
        from pandastack.cli.restore_db import restore

        restore(args.backup, database_url(args.db), force_clean=args.force_clean)
        return 0
    from pandastack.host.objects import backup

    directory: Path = args.dir
    if not directory.is_dir():
        raise ValueError(f"no backup directory at {directory}")

    counts = on_backup_store(directory, args.store, lambda store: backup.restore_objects(
        store, directory, say=console.log))
    console.print(f"restored {counts.objects} objects and {counts.manifests} manifests from "
                  f"{directory}")
    return 0
