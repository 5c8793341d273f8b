"""The `pandastack files` commands other than `watch` (registered by files.py): list, stat,
read, write, fetch, make, move, remove and search files in a sandbox, each with `--json`
where it prints something; `put` and `get` stream and show progress on a terminal's stderr.

    pandastack files grep SANDBOX /work TODO -i     # path:line:text, as grep -rn prints
    pandastack files glob SANDBOX /work '**/*.py'   # one path a line
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import stat as stat_mode
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from pandastack.sdk import Client, FileEntry

from .usage import print_table

__all__ = ["COMMANDS", "add_parsers"]

COLUMNS = ("name", "type", "size", "mode", "modified")


def add_parsers(fs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def command(name: str, help_text: str, *paths: str) -> argparse.ArgumentParser:
        p = fs.add_parser(name, help=help_text)
        p.add_argument("sandbox_id", metavar="SANDBOX")
        for path in paths:
            p.add_argument(path)
        return p

    ls = command("ls", "list a directory", "path")
    st = command("stat", "one file's type, size, mode and time", "path")
    command("cat", "print a file's bytes to stdout", "path")
    put = command("put", "upload a local file (streamed)", "local", "remote")
    put.add_argument("--mode", type=lambda t: int(t, 8), help="octal, e.g. 755")
    get = command("get", "download a file (streamed; LOCAL - for stdout)", "remote")
    get.add_argument("local", nargs="?", help="default: the remote file's name, here")
    mkdir = command("mkdir", "make a directory (and its parents)", "path")
    mv = command("mv", "rename or move a file", "src", "dst")
    rm = command("rm", "remove a file (a directory with -r)", "path")
    rm.add_argument("-r", "--recursive", action="store_true")
    grep = command("grep", "lines holding a literal text, in the files under a path "
                   "(searched in the sandbox)", "path", "pattern")
    grep.add_argument("-i", "--ignore-case", action="store_true", help="fold ASCII letters")
    glob = command("glob", "the paths under a directory that a pattern (*, ?, **) matches",
                   "path", "pattern")
    for p in (put, get):
        p.add_argument("--quiet", action="store_true", help="no progress bar")
    for p in (ls, st, put, get, mkdir, mv, rm, grep, glob):
        p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


def _row(e: FileEntry) -> tuple[str, ...]:
    return (e.name, e.type, str(e.size), stat_mode.filemode(e.mode), _when(e.mtime))


def _done(args: argparse.Namespace, doc: dict[str, object]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(doc) + "\n")


def _ls(client: Client, args: argparse.Namespace) -> int:
    entries = client.sandboxes.connect(args.sandbox_id).files.list(args.path)
    if args.json:
        sys.stdout.write(json.dumps({"entries": [e.model_dump(mode="json") for e in entries]},
                                    indent=2) + "\n")
    else:
        print_table(COLUMNS, [_row(e) for e in entries], args.path)
    return 0


def _stat(client: Client, args: argparse.Namespace) -> int:
    entry = client.sandboxes.connect(args.sandbox_id).files.stat(args.path)
    if args.json:
        sys.stdout.write(json.dumps(entry.model_dump(mode="json"), indent=2) + "\n")
    else:
        sys.stdout.write("\t".join((entry.path, *_row(entry)[1:])) + "\n")
    return 0


def _cat(client: Client, args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    for chunk in client.sandboxes.connect(args.sandbox_id).files.read(args.path, "stream"):
        out.write(chunk)
    out.flush()
    return 0


@contextlib.contextmanager
def _progress(what: str, total: int | None, quiet: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr (a terminal's, and not `quiet`); yields its update."""
    console = Console(file=sys.stderr)
    if quiet or not console.is_terminal:
        yield lambda done: None
        return
    with Progress("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done: bar.update(task, completed=done)


def _put(client: Client, args: argparse.Namespace) -> int:
    local = Path(args.local)
    size = local.stat().st_size if local.is_file() else None
    with _progress(f"put {local.name}", size, args.quiet) as update:
        written = client.sandboxes.connect(args.sandbox_id).files.upload(
            local, args.remote, args.mode, on_progress=update)
    _done(args, written.model_dump(mode="json"))
    return 0


def _get(client: Client, args: argparse.Namespace) -> int:
    sbx = client.sandboxes.connect(args.sandbox_id)
    if args.local == "-":
        out = sys.stdout.buffer
        for chunk in sbx.files.read(args.remote, "stream"):
            out.write(chunk)
        out.flush()
        return 0
    local = Path(args.local or Path(args.remote).name)
    size = sbx.files.stat(args.remote).size
    with _progress(f"get {Path(args.remote).name}", size, args.quiet) as update:
        written = sbx.files.download(args.remote, local, on_progress=update)
    _done(args, {"path": str(local), "bytes": written})
    return 0


def _mkdir(client: Client, args: argparse.Namespace) -> int:
    client.sandboxes.connect(args.sandbox_id).files.mkdir(args.path)
    _done(args, {"made": args.path})
    return 0


def _mv(client: Client, args: argparse.Namespace) -> int:
    client.sandboxes.connect(args.sandbox_id).files.rename(args.src, args.dst)
    _done(args, {"moved": args.src, "to": args.dst})
    return 0


def _rm(client: Client, args: argparse.Namespace) -> int:
    client.sandboxes.connect(args.sandbox_id).files.remove(args.path, recursive=args.recursive)
    _done(args, {"removed": args.path})
    return 0


def _truncated(args: argparse.Namespace, truncated: bool) -> None:
    if truncated and not args.json:
        sys.stderr.write(f"{args.files_command}: stopped at the sandbox's bound; "
                         "there may be more (narrow the path or the pattern)\n")


def _grep(client: Client, args: argparse.Namespace) -> int:
    found = client.sandboxes.connect(args.sandbox_id).files.grep(
        args.path, args.pattern, ignore_case=args.ignore_case)
    if args.json:
        sys.stdout.write(json.dumps(found.model_dump(mode="json"), indent=2) + "\n")
    for m in [] if args.json else found.matches:
        sys.stdout.write(f"{m.path}:{m.line}:{m.text}\n")
    _truncated(args, found.truncated)
    return 0


def _glob(client: Client, args: argparse.Namespace) -> int:
    found = client.sandboxes.connect(args.sandbox_id).files.glob(args.path, args.pattern)
    if args.json:
        sys.stdout.write(json.dumps(found.model_dump(mode="json"), indent=2) + "\n")
    for path in [] if args.json else found.paths:
        sys.stdout.write(path + "\n")
    _truncated(args, found.truncated)
    return 0


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "ls": _ls, "stat": _stat, "cat": _cat, "put": _put, "get": _get, "mkdir": _mkdir,
    "mv": _mv, "rm": _rm, "grep": _grep, "glob": _glob,
}
