"""`pandastack teams set-quota|get-quota`: a team's quota, through the API server, with an
admin key (configured as for `pandastack sandbox`).

    pandastack teams set-quota acme --max-sandboxes 20 --max-vcpus 16 --max-memory-mb 32768 \\
        --max-volume-gb 100 --monthly-budget-usd 50
    pandastack teams set-quota acme --clear max-vcpus     # back to the server's default
    pandastack teams get-quota acme [--json]

A limit not given keeps its value. Exit status: 0 on success; 1 when the API or the
configuration says no.
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx

from pandastack.sdk import Client, QuotaInfo
from pandastack.wire.usage import QUOTA_LIMITS

from .sandbox import run_client
from .usage import print_table

__all__ = ["add_parser", "quota_rows", "run"]

_FLAGS = {"max_sandboxes": int, "max_vcpus": int, "max_memory_mb": int,
          "max_volume_gb": float, "monthly_budget_usd": float, "max_hibernated": int,
          "max_snapshot_gb": float, "max_template_gb": float}
_CURRENT = {"max_sandboxes": "sandboxes", "max_vcpus": "vcpus", "max_memory_mb": "memory_mb",
            "max_volume_gb": "volume_gb", "monthly_budget_usd": "month_spend_usd",
            "max_hibernated": "hibernated", "max_snapshot_gb": "snapshot_gb",
            "max_template_gb": "template_gb"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("teams", help="set and show teams' quotas (admin key)",
                       description="Per-team quotas; a team without its own limit has the "
                                   "server's default (PANDASTACK_QUOTA_*; unset: unlimited).")
    ts = p.add_subparsers(dest="teams_command", required=True, metavar="COMMAND")
    setq = ts.add_parser("set-quota", help="set TEAM's limits (those not given keep theirs)")
    getq = ts.add_parser("get-quota", help="TEAM's limits in force and what it holds now")
    for sp in (setq, getq):
        sp.add_argument("team", metavar="TEAM")
        sp.add_argument("--json", action="store_true", help="print JSON for scripts")
    for name, conv in _FLAGS.items():
        setq.add_argument("--" + name.replace("_", "-"), type=conv, metavar="N",
                          dest=name)
    setq.add_argument("--clear", action="append", default=[], metavar="LIMIT",
                      choices=[n.replace("_", "-") for n in QUOTA_LIMITS],
                      help="return a limit to the server's default (repeatable)")


def _value(value: float | None) -> str:
    return "unlimited" if value is None else f"{value:g}"


def quota_rows(info: QuotaInfo) -> list[tuple[str, ...]]:
    """(limit, value, in use, from) per limit."""
    used = info.usage.model_dump()
    return [(name, _value(getattr(info, name)), f"{used[_CURRENT[name]]:g}",
             "server default" if name in info.defaults else "team")
            for name in QUOTA_LIMITS]


def _show(info: QuotaInfo, as_json: bool) -> int:
    if as_json:
        sys.stdout.write(json.dumps(info.model_dump(mode="json"), indent=2) + "\n")
    else:
        print_table(("limit", "value", "in use", "from"), quota_rows(info),
                    f"quota of team {info.team}")
    return 0


def _set(client: Client, args: argparse.Namespace) -> int:
    limits = {name: getattr(args, name) for name in _FLAGS}
    info = client.teams.set_quota(args.team, **limits,
                                  clear=[c.replace("-", "_") for c in args.clear])
    return _show(info, args.json)


def _get(client: Client, args: argparse.Namespace) -> int:
    return _show(client.teams.get_quota(args.team), args.json)


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack teams ...` command; returns the exit status."""
    command = _set if args.teams_command == "set-quota" else _get
    return run_client(args, command, transport)
