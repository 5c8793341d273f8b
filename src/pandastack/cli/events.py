"""`pandastack events`: follow the team's event log through the API server (the key as for
`pandastack sandbox`).

    pandastack events                         # from now on, until Ctrl-C
    pandastack events --types 'sandbox.*' --after 120 --count 10 --json

One tab-separated line per event (id, type, sandbox or template, actor), or with `--json`
one JSON object per line. Exit status: 0 on success; 1 when the API says no.
"""

from __future__ import annotations

import argparse
import json
import sys

from pandastack.sdk import Client

from .sandbox import run_client

__all__ = ["add_parser", "run", "types_arg"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("events", help="follow the team's events (Ctrl-C to stop)")
    p.add_argument("--types", default=None,
                   help="comma-separated types or prefixes (sandbox.*); default: all")
    p.add_argument("--after", type=int, default=None,
                   help="resume after this event id (default: from now)")
    p.add_argument("--team", default=None, help="another team's (admin keys)")
    p.add_argument("--count", type=int, default=None, help="stop after this many events")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def types_arg(raw: str | None) -> list[str] | None:
    return None if raw is None else [t.strip() for t in raw.split(",") if t.strip()]


def _follow(client: Client, args: argparse.Namespace) -> int:
    seen = 0
    with client.events.stream(types_arg(args.types), after=args.after,
                              team=args.team) as stream:
        try:
            for e in stream:
                if args.json:
                    line = json.dumps(e.model_dump(), separators=(",", ":"))
                else:
                    line = f"{e.id}\t{e.type}\t{e.sandbox_id or e.template or ''}\t{e.actor}"
                print(line, flush=True)
                seen += 1
                if args.count is not None and seen >= args.count:
                    break
        except KeyboardInterrupt:
            pass
        if stream.truncated is not None:
            sys.stderr.write(f"note: events up to {stream.truncated.get('pruned_through')} "
                             "were pruned from the server's log before this stream\n")
    return 0


def run(args: argparse.Namespace) -> int:
    return run_client(args, _follow, None)
