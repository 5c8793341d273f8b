"""`pandastack restore objects DIR`: puts an object store backup (`pandastack backup objects`)
back into the store: the objects it lacks, then every manifest. Nothing in the store is
deleted (docs/operations.md, "Backups")."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from pandastack.cli.backup import add_store_option, on_backup_store

console = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restore", help="put an object store backup back into the store")
    what = p.add_subparsers(dest="what", required=True)
    objects = what.add_parser("objects", help="upload the backup in DIR: the objects the store "
                                              "lacks, then its manifests (over the store's)")
    objects.add_argument("dir", type=Path, help="a directory `pandastack backup objects` made")
    add_store_option(objects)


def run(args: argparse.Namespace) -> int:
    from pandastack.host.objects import backup

    directory: Path = args.dir
    if not directory.is_dir():
        raise ValueError(f"no backup directory at {directory}")

    counts = on_backup_store(directory, args.store, lambda store: backup.restore_objects(
        store, directory, say=console.log))
    console.print(f"restored {counts.objects} objects and {counts.manifests} manifests from "
                  f"{directory}")
    return 0
