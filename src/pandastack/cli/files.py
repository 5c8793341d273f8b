"""`pandastack files COMMAND`: a sandbox's files through the API server (the key as for
`pandastack sandbox`); `pandastack files --help` lists the commands (file_ops.py has all
but `watch`).

    pandastack files ls SANDBOX /work                # a table (tab-separated when piped)
    pandastack files cat SANDBOX /work/out.txt       # the bytes, to stdout
    pandastack files put SANDBOX ./data.csv /work/data.csv
    pandastack files get SANDBOX /work/result.png ./result.png   # or - for stdout
    pandastack files rm SANDBOX /work/tmp -r
    pandastack files watch SANDBOX /work            # one line per event until Ctrl-C
    pandastack files watch SANDBOX /work --json     # one JSON object per line
    pandastack files watch SANDBOX /work --no-recursive --count 10

`put` and `get` stream (a file of any size, memory bounded) and show a progress bar on
stderr when it is a terminal, unless `--quiet`; stdout gets only the result.

Exit status: 0 on success (watch: it ended: Ctrl-C, --count reached, the directory went
away); 1 when the API or the configuration says no; 3 after a watch's overflow (events were
lost: list the directory again).
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx

from pandastack.sdk import Client

from . import file_ops
from .sandbox import run_client

__all__ = ["add_parser", "run"]

EXIT_OVERFLOW = 3


def _count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return n


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("files", help="a sandbox's files: ls, cat, put, get, rm, watch ...",
                       description="A sandbox's files through the API server.",
                       epilog="exit status: 0 ok; 1 the API or the configuration said no; "
                              "3 watch: events were lost (overflow)")
    fs = p.add_subparsers(dest="files_command", required=True, metavar="COMMAND")
    file_ops.add_parsers(fs)
    watch = fs.add_parser("watch", help="print file events under a directory as they happen")
    watch.add_argument("sandbox_id", metavar="SANDBOX")
    watch.add_argument("path", help="a directory in the sandbox")
    watch.add_argument("--no-recursive", dest="recursive", action="store_false",
                       help="only the directory itself, not the ones under it")
    watch.add_argument("--count", type=_count, metavar="N", help="stop after N events")
    watch.add_argument("--json", action="store_true", help="one JSON object per event")


def _watch(client: Client, args: argparse.Namespace) -> int:
    sbx = client.sandboxes.connect(args.sandbox_id)
    seen = 0
    with sbx.files.watch(args.path, recursive=args.recursive) as w:
        try:
            for event in w:
                if args.json:
                    line = json.dumps(event.model_dump(exclude_none=True))
                elif event.old_path is not None:
                    line = f"{event.type} {event.old_path} -> {event.path}"
                else:
                    line = f"{event.type} {event.path}"
                sys.stdout.write(line + "\n")
                sys.stdout.flush()  # a pipe sees each event as it happens
                if event.type == "overflow":
                    return EXIT_OVERFLOW
                seen += 1
                if args.count is not None and seen >= args.count:
                    break
        except KeyboardInterrupt:
            pass
    return 0


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    return run_client(args, {"watch": _watch, **file_ops.COMMANDS}[args.files_command],
                      transport)
