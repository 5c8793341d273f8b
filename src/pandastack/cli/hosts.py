"""`pandastack hosts list|drain|undrain`: a cluster's hosts, through the API server, with an
admin key (configured as for `pandastack sandbox`: `PANDASTACK_API` / `PANDASTACK_API_KEY`,
else the config file `pandastack serve` writes, which holds the admin key).

    pandastack hosts list
    pandastack hosts drain host-0123456789ab     # no new sandbox there; move its running ones
    pandastack hosts undrain host-0123456789ab

`list` prints a table (tab-separated lines when stdout is not a terminal), `drain` what moved
where and what did not move; `--json` prints the API's document instead. A server that drives
one host lists none and refuses a drain (there is nowhere to move to).

Exit status: 0 on success; 1 when the API or the configuration says no; 2 when a drain left
sandboxes it could not move on the host (they keep running there; drain again to retry).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from pandastack.sdk import Client, DrainResult, HostInfo

from .sandbox import EXIT_API_ERROR as EXIT_API_ERROR  # what an API error exits with
from .sandbox import duration, run_client

__all__ = ["add_parser", "list_rows", "run"]

EXIT_NOT_ALL_MOVED = 2
LIST_COLUMNS = ("id", "state", "endpoint", "vcpus", "memory", "sandboxes", "heartbeat",
                "version")
_STATE_STYLE = {"live": "green", "draining": "yellow", "incompatible": "red", "stale": "red",
                "lost": "bold red"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "hosts", help="list a cluster's hosts, drain and undrain them (admin key)",
        description="The hosts of a cluster through the API server (an admin key: "
                    "PANDASTACK_API_KEY, else ~/.config/pandastack/config.json).",
        epilog="exit status: 0 ok; 1 the API or the configuration said no; 2 a drain left "
               "sandboxes it could not move (they keep running; drain again to retry).")
    hs = p.add_subparsers(dest="hosts_command", required=True, metavar="COMMAND")
    ls = hs.add_parser("list", help="every registered host: live, draining, incompatible "
                                    "(a version apart: why, on stderr), stale or lost")
    drain = hs.add_parser("drain", help="take no new sandbox on HOST and move its running "
                                        "and paused ones to other hosts")
    drain.add_argument("host", metavar="HOST", help="host id (see `hosts list`)")
    undrain = hs.add_parser("undrain", help="let HOST take new sandboxes again")
    undrain.add_argument("host", metavar="HOST")
    for sp in (ls, drain, undrain):
        sp.add_argument("--json", action="store_true", help="print JSON for scripts")


def list_rows(hosts: Sequence[HostInfo]) -> list[tuple[str, ...]]:
    """The cells of `hosts list` (see LIST_COLUMNS), one tuple per host."""
    return [(h.id, h.state, h.endpoint, f"{h.used_vcpus}/{h.vcpus}",
             f"{h.used_memory_mb}/{h.memory_mb}M", str(h.sandboxes),
             f"{duration(h.heartbeat_age_seconds)} ago", h.version or "-") for h in hosts]


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def _print_rows(rows: Sequence[tuple[str, ...]], empty: str) -> None:
    console = Console(file=sys.stdout)
    if not console.is_terminal:  # plain tab-separated lines for scripts that do not want JSON
        for row in rows:
            sys.stdout.write("\t".join(row) + "\n")
        return
    if not rows:
        Console(file=sys.stderr).print(empty, style="dim")
        return
    table = Table(box=None, header_style="bold")
    for column in LIST_COLUMNS:
        table.add_column(column.upper(), no_wrap=True)
    for row in rows:
        style = _STATE_STYLE.get(row[1], "")
        table.add_row(row[0], f"[{style}]{row[1]}[/]" if style else row[1], *row[2:])
    console.print(table)


def _list(client: Client, args: argparse.Namespace) -> int:
    hosts = client.hosts.list()
    if args.json:
        _print_json([h.model_dump(mode="json") for h in hosts])
    else:
        _print_rows(list_rows(hosts), "no hosts: this server drives one host, not a cluster")
        for h in hosts:
            if h.incompatible_reason:
                sys.stderr.write(f"{h.id} is incompatible: {h.incompatible_reason}\n")
    return 0


def _drain(client: Client, args: argparse.Namespace) -> int:
    result: DrainResult = client.hosts.drain(args.host)
    if args.json:
        _print_json(result.model_dump(mode="json"))
    else:
        out = sys.stdout
        out.write(f"{result.host_id} is draining: it takes no new sandbox\n")
        for sandbox_id, host_id in sorted(result.moved.items()):
            out.write(f"moved {sandbox_id} to {host_id}\n")
        for sandbox_id in sorted(result.stayed_hibernated):
            out.write(f"stayed {sandbox_id} (hibernated: it wakes on another host)\n")
        for sandbox_id, why in sorted(result.failed.items()):
            sys.stderr.write(f"not moved {sandbox_id}: {why}\n")
    return EXIT_NOT_ALL_MOVED if result.failed else 0


def _undrain(client: Client, args: argparse.Namespace) -> int:
    host = client.hosts.undrain(args.host)
    if args.json:
        _print_json(host.model_dump(mode="json"))
    else:
        takes = ": it takes new sandboxes" if host.state == "live" else ""
        sys.stdout.write(f"{host.id} is {host.state}{takes}\n")
    return 0


_COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "list": _list, "drain": _drain, "undrain": _undrain,
}


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack hosts ...` command; returns the exit status. `transport`
    replaces httpx's (tests)."""
    return run_client(args, lambda client, a: _COMMANDS[a.hosts_command](client, a), transport)
