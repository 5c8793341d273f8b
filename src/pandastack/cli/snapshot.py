"""`pandastack snapshot list|get|delete`: the team's sandbox snapshots, through the API (take
one with `pandastack sandbox snapshot ID`; create from one with the SDK's
`Sandbox.create(snapshot=...)`). A table on a terminal (tab-separated lines otherwise);
`--json` prints the API's document. Exit status: 0 on success; 1 when the API or the
configuration says no."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence

import httpx

from pandastack.sdk import Client, SnapshotInfo

from .sandbox import run_client
from .usage import print_table

__all__ = ["add_parser", "run"]

COLUMNS = ("id", "name", "from sandbox", "template", "size MiB", "created")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("snapshot", help="list, show and delete the team's sandbox snapshots")
    ss = p.add_subparsers(dest="snapshot_command", required=True, metavar="COMMAND")
    ls = ss.add_parser("list", help="the team's snapshots")
    get = ss.add_parser("get", help="one snapshot")
    get.add_argument("id", metavar="ID")
    delete = ss.add_parser("delete", help="delete snapshots (sandboxes made of them stay)")
    delete.add_argument("ids", nargs="+", metavar="ID")
    for q in (ls, get, delete):
        q.add_argument("--json", action="store_true", help="print JSON for scripts")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


def _show(snapshots: Sequence[SnapshotInfo], as_json: bool, one: bool) -> None:
    if as_json:
        doc = (snapshots[0].model_dump(mode="json") if one
               else {"snapshots": [s.model_dump(mode="json") for s in snapshots]})
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    print_table(COLUMNS, [(s.id, s.name or "-", s.source_sandbox or "-", s.template,
                           f"{s.size_bytes / (1 << 20):.0f}", _when(s.created_at))
                          for s in snapshots], "snapshots")


def _snapshot(client: Client, args: argparse.Namespace) -> int:
    if args.snapshot_command == "list":
        _show(client.snapshots.list(), args.json, False)
    elif args.snapshot_command == "get":
        _show([client.snapshots.get(args.id)], args.json, True)
    elif args.snapshot_command == "delete":
        for snapshot_id in args.ids:
            client.snapshots.delete(snapshot_id)
        if args.json:
            sys.stdout.write(json.dumps({"deleted": list(args.ids)}) + "\n")
    return 0


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack snapshot` command; returns the exit status."""
    return run_client(args, _snapshot, transport)
