"""`pandastack usage`: what the team held and what it cost, through the API server (the key
as for `pandastack sandbox`; an admin key sees every team, or `--team`).

    pandastack usage                          # this month so far, by sandbox
    pandastack usage --group-by day --start 2026-03-01 --end 2026-04-01
    pandastack usage --json

Times are UNIX seconds or ISO 8601 (UTC unless they say otherwise). A table on a terminal
(tab-separated lines otherwise); `--json` prints the API's document.

Exit status: 0 on success; 1 when the API or the configuration says no.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

import httpx
from rich.console import Console
from rich.table import Table

from pandastack.sdk import Client, UsageReport
from pandastack.wire.usage import USAGE_GROUPS

from .sandbox import run_client

__all__ = ["add_parser", "report_rows", "run"]

EXIT_API_ERROR = 1
QUANTITY_COLUMNS = ("vcpu-s", "mem GiB-s", "disk GiB-s", "volume GiB-s", "snapshot GiB-s",
                    "cost $")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "usage", help="what the team held and what it cost (by sandbox, day or template)",
        description="Usage and cost from the server's meter: vCPU and memory while a "
                    "sandbox runs or is paused, disk until it ends, volumes and snapshots "
                    "while they exist; priced by the server's rate card.")
    p.add_argument("--start", help="UNIX seconds or ISO 8601 (default: the start of this "
                                   "month, UTC)")
    p.add_argument("--end", help="UNIX seconds or ISO 8601 (default: now)")
    p.add_argument("--group-by", choices=USAGE_GROUPS, default="sandbox")
    p.add_argument("--team", help="one team's usage (admin keys; others see their own)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _seconds(value: float) -> str:
    return f"{value:,.1f}"


def report_rows(report: UsageReport) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """(header, rows) of the table, the totals last."""
    key = {"sandbox": "sandbox", "day": "day", "template": "template"}[report.group_by]
    header = ("team", key, *QUANTITY_COLUMNS)
    rows: list[tuple[str, ...]] = []
    for row in report.rows:
        if report.group_by == "sandbox":
            name = row.sandbox_id or (f"volume {row.volume_id}" if row.volume_id else "-")
        else:
            name = (row.day if report.group_by == "day" else row.template) or "-"
        rows.append((row.team, name, _seconds(row.vcpu_seconds),
                     _seconds(row.memory_gib_seconds), _seconds(row.disk_gib_seconds),
                     _seconds(row.volume_gib_seconds), _seconds(row.snapshot_gib_seconds),
                     f"{row.cost_usd:.6f}"))
    t = report.totals
    rows.append(("total", "", _seconds(t.vcpu_seconds), _seconds(t.memory_gib_seconds),
                 _seconds(t.disk_gib_seconds), _seconds(t.volume_gib_seconds),
                 _seconds(t.snapshot_gib_seconds), f"{t.cost_usd:.6f}"))
    return header, rows


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def print_table(header: Sequence[str], rows: Sequence[tuple[str, ...]], title: str, *,
                total: bool = False) -> None:
    """A table on a terminal (the last row bold when it is a `total`), else tab-separated
    lines."""
    console = Console(file=sys.stdout)
    if not console.is_terminal:
        for row in rows:
            sys.stdout.write("\t".join(row) + "\n")
        return
    table = Table(box=None, header_style="bold", title=title, title_justify="left")
    for i, column in enumerate(header):
        table.add_column(column.upper(), no_wrap=True, justify="right" if i > 1 else "left")
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold" if total and i == len(rows) - 1 else "")
    console.print(table)


def _usage(client: Client, args: argparse.Namespace) -> int:
    report = client.usage(start=args.start, end=args.end, group_by=args.group_by,
                          team=args.team)
    if args.json:
        sys.stdout.write(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
        return 0
    header, rows = report_rows(report)
    print_table(header, rows, f"{report.team or 'every team'}: {_when(report.start)} to "
                              f"{_when(report.end)}", total=True)
    return 0


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack usage` command; returns the exit status."""
    return run_client(args, _usage, transport)
