"""`pandastack volume create|list|get|delete|resize|snapshot|snapshots|delete-snapshot|move`:
the team's volumes through the API server (the key as for `pandastack sandbox`). Mount one
with `pandastack sandbox create --volume NAME:/PATH[:ro]`.

    pandastack volume create data --size-mb 2048
    pandastack volume list
    pandastack volume resize data --size-mb 4096     # while no sandbox has it attached
    pandastack volume snapshot data                  # into the object store
    pandastack volume create data2 --from-snapshot vsnap-...
    pandastack volume move data HOST_ID              # admin keys, many hosts
    pandastack volume delete data

A table on a terminal (tab-separated lines otherwise); `--json` prints the API's document.

Exit status: 0 on success; 1 when the API or the configuration says no (e.g. delete or
resize while attached: 409 volume_in_use).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import httpx

from pandastack.rules import DEFAULT_VOLUME_MB
from pandastack.sdk import Client, VolumeInfo, VolumeSnapshotInfo

from .args import positive_int
from .sandbox import run_client
from .usage import print_table

__all__ = ["add_parser", "run", "volume_rows"]

COLUMNS = ("name", "id", "size MiB", "attached to")
SNAPSHOT_COLUMNS = ("id", "volume", "size MiB", "stored MiB", "created")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("volume", help="create, list, grow and delete the team's volumes",
                       description="Volumes outlive every sandbox; one sandbox may mount a "
                                   "volume read-write at a time, any number read-only.")
    vs = p.add_subparsers(dest="volume_command", required=True)
    create = vs.add_parser("create", help="create an empty volume")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--size-mb", type=positive_int, default=None, metavar="MB",
                        help=f"size (default {DEFAULT_VOLUME_MB}, or the snapshot's)")
    create.add_argument("--from-snapshot", metavar="ID",
                        help="a volume snapshot: the new volume holds what it holds")
    ls = vs.add_parser("list", help="the team's volumes")
    get = vs.add_parser("get", help="one volume and the sandboxes that have it")
    get.add_argument("name", metavar="NAME")
    delete = vs.add_parser("delete", help="delete a volume and its data (not while attached)")
    delete.add_argument("name", metavar="NAME")
    resize = vs.add_parser("resize", help="grow a detached volume (its file system follows)")
    resize.add_argument("name", metavar="NAME")
    resize.add_argument("--size-mb", type=positive_int, required=True, metavar="MB")
    snap = vs.add_parser("snapshot", help="store what a volume holds in the object store "
                         "(not while a sandbox writes to it)")
    snap.add_argument("name", metavar="NAME")
    snaps = vs.add_parser("snapshots", help="the team's volume snapshots")
    snaps.add_argument("name", metavar="NAME", nargs="?", help="of this volume name only")
    drop = vs.add_parser("delete-snapshot", help="delete a volume snapshot")
    drop.add_argument("snapshot_id", metavar="ID")
    move = vs.add_parser("move", help="move a detached volume to another host (admin keys)")
    move.add_argument("name", metavar="NAME")
    move.add_argument("host_id", metavar="HOST_ID")
    move.add_argument("--team", help="the volume's team (default: the key's)")
    for q in (create, ls, get, delete, resize, snap, snaps, drop, move):
        q.add_argument("--json", action="store_true", help="print JSON for scripts")


def volume_rows(volumes: Sequence[VolumeInfo]) -> list[tuple[str, ...]]:
    return [(v.name, v.id, str(v.size_mb),
             ", ".join(f"{a.sandbox_id}:{a.mount_path}{':ro' if a.read_only else ''}"
                       for a in v.attachments) or "-") for v in volumes]


def _show(volumes: Sequence[VolumeInfo], as_json: bool, one: bool) -> None:
    if as_json:
        doc = (volumes[0].model_dump(mode="json") if one
               else {"volumes": [v.model_dump(mode="json") for v in volumes]})
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        print_table(COLUMNS, volume_rows(volumes), "volumes")


def _show_snapshots(snapshots: Sequence[VolumeSnapshotInfo], as_json: bool, one: bool) -> None:
    if as_json:
        doc = (snapshots[0].model_dump(mode="json") if one
               else {"snapshots": [v.model_dump(mode="json") for v in snapshots]})
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    print_table(SNAPSHOT_COLUMNS, [
        (v.id, v.volume_name, str(v.size_mb), f"{v.stored_bytes / (1 << 20):.1f}",
         time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.created_at)))
        for v in snapshots], "volume snapshots")


def _volume(client: Client, args: argparse.Namespace) -> int:
    command = args.volume_command
    if command == "create":
        _show([client.volumes.create(args.name, size_mb=args.size_mb,
                                     from_snapshot=args.from_snapshot)], args.json, True)
    elif command == "snapshot":
        _show_snapshots([client.volumes.snapshot(args.name)], args.json, True)
    elif command == "snapshots":
        _show_snapshots(client.volumes.snapshots(args.name), args.json, False)
    elif command == "delete-snapshot":
        client.volumes.delete_snapshot(args.snapshot_id)
        if args.json:
            sys.stdout.write(json.dumps({"deleted": args.snapshot_id}) + "\n")
    elif command == "move":
        _show([client.volumes.move(args.name, args.host_id, team=args.team)], args.json, True)
    elif command == "list":
        _show(client.volumes.list(), args.json, False)
    elif command == "get":
        _show([client.volumes.get(args.name)], args.json, True)
    elif command == "resize":
        _show([client.volumes.resize(args.name, args.size_mb)], args.json, True)
    elif command == "delete":
        client.volumes.delete(args.name)
        if args.json:
            sys.stdout.write(json.dumps({"deleted": args.name}) + "\n")
    return 0


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack volume` command; returns the exit status."""
    return run_client(args, _volume, transport)
