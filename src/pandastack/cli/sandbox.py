"""`pandastack sandbox create|list|exec|kill|shell|...`: sandboxes through the API server (the
commands about one sandbox's state and reach are in sandbox_ops.py).

Built on the Python SDK, configured the way it is: `PANDASTACK_API` / `PANDASTACK_API_KEY`,
else `~/.config/pandastack/config.json` (which `pandastack serve` writes on first start).

    ID=$(pandastack sandbox create --ttl 600 --metadata owner=me)
    pandastack sandbox exec "$ID" -- python -c 'print(6*7)'
    pandastack sandbox list --state running
    pandastack sandbox shell "$ID"
    pandastack sandbox kill "$ID"

Output is for humans by default: `create` prints the id, `list` a table (tab-separated lines
when stdout is not a terminal), `exec` streams the command's stdout and stderr as they come.
With `--json` each prints one JSON document instead (`exec --json` waits for the end and prints
the whole `ExecResult`).

Exit status: 0 on success; 1 when the API or the configuration says no (one line on stderr, as
`{"error": ...}` with `--json`). `exec` exits with the command's exit code, 124 when it hit its
`--timeout`, and 125 when it could not be run at all. `shell` exits with the shell's code (a
terminal, cli/shell.py; line by line when stdin is not a terminal: the last command's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import httpx
from rich.console import Console
from rich.table import Table

from pandastack.cli import sandbox_ops
from pandastack.cli.args import positive_int
from pandastack.cli.shell import terminal
from pandastack.rules import MAX_EXEC_TIMEOUT_SECONDS
from pandastack.sdk import (
    APIConnectionError,
    APIError,
    AuthError,
    Client,
    ExecResult,
    NotFoundError,
    PandastackError,
    Sandbox,
    SandboxError,
    SandboxInfo,
    resolve_config,
)
from pandastack.sdk.errors import TimeoutError as SDKTimeoutError
from pandastack.wire.sandboxes import ENDED_STATES

__all__ = ["add_parser", "format_error", "list_rows", "parse_kv", "run"]

#: Default `--timeout` of `exec` and of each `shell` line, in seconds.
DEFAULT_EXEC_TIMEOUT = 600.0
EXIT_API_ERROR = 1
EXIT_TIMED_OUT = 124
EXIT_EXEC_FAILED = 125
EXIT_BROKEN_PIPE = 141
STATES = ("starting", "running", "paused", "hibernated", "stopped", "killed", "expired", "reaped",
          "failed")
LIST_COLUMNS = ("id", "state", "template", "age", "expires", "size", "metadata")


# -- arguments ----------------------------------------------------------------------------

def parse_kv(text: str) -> tuple[str, str]:
    """`key=value` (the value may contain `=` and be empty) for --metadata and --env."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_volume(text: str) -> dict[str, object]:
    """`NAME:/path` or `NAME:/path:ro` for --volume."""
    name, sep, path = text.partition(":")
    read_only = path.endswith(":ro")
    path = path.removesuffix(":ro")
    if not sep or not name or not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"expected NAME:/PATH or NAME:/PATH:ro, got {text!r}")
    return {"name": name, "mount_path": path, "read_only": read_only}


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_EXEC_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_EXEC_TIMEOUT_SECONDS} seconds")
    return value


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sandbox", help="create, list, exec in, fork, snapshot and kill sandboxes (through "
                        "the API server)",
        description="Sandboxes through the API server (PANDASTACK_API / PANDASTACK_API_KEY, "
                    "else ~/.config/pandastack/config.json).",
        epilog="exit status: 0 ok; 1 the API or the configuration said no (one line on "
               "stderr); exec: the command's own code, 124 timed out, 125 could not run it.")
    ss = p.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")

    create = ss.add_parser("create", help="create a sandbox and print its id")
    create.add_argument("--template", default="base", help="template to restore (default base)")
    create.add_argument("--ttl", type=positive_int, metavar="SECONDS",
                        help="lifetime in seconds (server default when omitted)")
    create.add_argument("--persistent", action="store_true",
                        help="exempt from the TTL and the idle reaper")
    create.add_argument("--vcpus", type=positive_int)
    create.add_argument("--memory-mb", type=positive_int, metavar="MB")
    create.add_argument("--disk-mb", type=positive_int, metavar="MB")
    create.add_argument("--metadata", type=parse_kv, nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE", help="labels (list can filter by them)")
    create.add_argument("--env", type=parse_kv, nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE", help="environment of every command")
    create.add_argument("--volume", type=parse_volume, action="append", default=[],
                        dest="volumes", metavar="NAME:/PATH[:ro]",
                        help="mount a team volume (repeatable; :ro for read-only)")
    _json_flag(create)

    ls = ss.add_parser("list", help="list this key's live sandboxes")
    ls.add_argument("--state", choices=STATES, help="only sandboxes in this state (also ended)")
    ls.add_argument("--all", action="store_true", dest="include_ended",
                    help="also the ended ones (killed, expired, reaped, failed)")
    ls.add_argument("--metadata", type=parse_kv, nargs="+", action="extend", default=[],
                    metavar="KEY=VALUE", help="only sandboxes carrying all these labels")
    ls.add_argument("--template", help="only sandboxes of this template")
    ls.add_argument("--limit", type=positive_int, metavar="N",
                    help="one page of N (--json: {\"sandboxes\", \"next_token\"}; otherwise "
                         "the next page's token on stderr)")
    ls.add_argument("--next-token", metavar="TOKEN", help="the page after the one that gave it")
    _json_flag(ls)

    ex = ss.add_parser("exec", help="run a command, streaming its output; exits with its code",
                       usage="%(prog)s [options] ID -- CMD [ARG ...]")
    ex.add_argument("id", metavar="ID")
    ex.add_argument("cmd", nargs="+", metavar="CMD",
                    help="one word: a shell command line (sh -c); several: an argv")
    ex.add_argument("--timeout", type=_timeout, default=DEFAULT_EXEC_TIMEOUT, metavar="SECONDS",
                    help=f"kill the command after this long (default {DEFAULT_EXEC_TIMEOUT:g})")
    ex.add_argument("--cwd", help="working directory in the sandbox")
    ex.add_argument("--env", type=parse_kv, nargs="+", action="extend", default=[],
                    metavar="KEY=VALUE")
    ex.add_argument("-i", "--stdin", action="store_true",
                    help="send this command's stdin (read to its end first) to the command")
    _json_flag(ex)

    kill = ss.add_parser("kill", help="kill sandboxes")
    kill.add_argument("ids", nargs="+", metavar="ID")
    _json_flag(kill)

    metrics = ss.add_parser("metrics", help="CPU, memory and disk use, measured in the guest now")
    metrics.add_argument("id", metavar="ID")
    _json_flag(metrics)

    sandbox_ops.add_parsers(ss)  # info, logs, pause ... url

    shell = ss.add_parser("shell", help="a terminal in a sandbox (its shell, or --cmd); with "
                                        "stdin not a terminal and no --cmd, a line-by-line "
                                        "shell")
    shell.add_argument("id", metavar="ID")
    shell.add_argument("--cmd", default=None, metavar="CMD",
                       help="run CMD (a shell command line) on the terminal instead of the "
                            "user's shell")
    shell.add_argument("--timeout", type=_timeout, default=DEFAULT_EXEC_TIMEOUT,
                       metavar="SECONDS", help="per-line command timeout (line-by-line shell)")


def exec_command(words: Sequence[str]) -> str | list[str]:
    """What `exec ID -- CMD...` runs: one word is a shell command line, several an argv."""
    return words[0] if len(words) == 1 else list(words)


# -- output -------------------------------------------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_error(exc: PandastackError, api_url: str | None = None) -> str:
    """One line for stderr: what went wrong, and the request id to quote."""
    if isinstance(exc, APIError):
        rid = f", request {exc.request_id}" if exc.request_id else ""
        return _one_line(f"{exc.message} ({exc.status} {exc.code}{rid})")
    where = f" at {api_url}" if api_url else ""
    if isinstance(exc, SDKTimeoutError):
        return _one_line(f"the pandastack server{where} did not answer in time ({exc})")
    if isinstance(exc, APIConnectionError):
        return _one_line(f"cannot reach the pandastack server{where} ({exc})")
    return _one_line(str(exc))


def error_json(exc: PandastackError) -> dict[str, Any]:
    message = exc.message if isinstance(exc, APIError) else str(exc)
    return {"error": {"type": type(exc).__name__, "status": exc.status, "code": exc.code,
                      "message": message, "request_id": exc.request_id}}


def duration(seconds: float) -> str:
    """A short human duration: 45s, 12m, 3h, 2d (rounded down)."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def list_rows(infos: Sequence[SandboxInfo], now: float) -> list[tuple[str, ...]]:
    """The cells of `sandbox list` (see LIST_COLUMNS), one tuple per sandbox."""
    rows: list[tuple[str, ...]] = []
    for info in infos:
        if info.state in ENDED_STATES:
            ended = info.ended_at if info.ended_at is not None else now
            expires = f"ended {duration(now - ended)} ago"
        elif info.persistent:
            expires = "persistent"
        elif info.expires_at is not None:
            expires = f"in {duration(info.expires_at - now)}"
        else:
            expires = "-"
        size = f"{info.vcpus} vCPU, {info.memory_mb}M"
        if info.disk_mb is not None:
            size += f", {info.disk_mb}M disk"
        labels = " ".join(f"{k}={v}" for k, v in sorted(info.metadata.items()))
        rows.append((info.id, info.state, info.template, duration(now - info.created_at),
                     expires, size, labels or "-"))
    return rows


_STATE_STYLE = {"running": "green", "starting": "yellow", "failed": "red"}


def list_table(rows: Sequence[tuple[str, ...]]) -> Table:
    table = Table(box=None, header_style="bold")
    for i, column in enumerate(LIST_COLUMNS):  # ids and states stay whole; labels may wrap
        whole = max((len(row[i]) for row in rows), default=0) if i < 2 else None
        table.add_column(column.upper(), min_width=whole, no_wrap=column != "metadata",
                         overflow="fold" if column == "metadata" else "ellipsis")
    for row in rows:
        style = _STATE_STYLE.get(row[1], "dim" if row[1] in ENDED_STATES else "")
        table.add_row(row[0], f"[{style}]{row[1]}[/]" if style else row[1], *row[2:])
    return table


def exit_status(result: ExecResult) -> int:
    """The CLI's exit status for a finished command."""
    if result.timed_out:
        return EXIT_TIMED_OUT
    return result.exit_code & 0xFF if result.exit_code >= 0 else EXIT_EXEC_FAILED


# -- commands -----------------------------------------------------------------------------

class _Streams:
    """Where the commands write; stdout/stderr looked up at call time (tests capture them)."""

    @property
    def out(self) -> TextIO:
        return sys.stdout

    @property
    def err(self) -> TextIO:
        return sys.stderr

    def print_json(self, value: Any) -> None:
        self.out.write(json.dumps(value, indent=2) + "\n")

    def writer(self, stream: TextIO) -> Callable[[str], None]:
        def write(text: str) -> None:
            stream.write(text)
            stream.flush()
        return write


def _create(client: Client, args: argparse.Namespace, io: _Streams) -> int:
    sbx = client.sandboxes.create(
        template=args.template, ttl_seconds=args.ttl, persistent=args.persistent,
        vcpus=args.vcpus, memory_mb=args.memory_mb, disk_mb=args.disk_mb,
        env=dict(args.env) or None, metadata=dict(args.metadata) or None,
        volumes=args.volumes or None)
    if args.json:
        io.print_json(sbx.info.model_dump(mode="json"))
    else:
        io.out.write(sbx.id + "\n")
    return 0


def _list(client: Client, args: argparse.Namespace, io: _Streams) -> int:
    page = client.sandboxes.list(
        state=args.state, metadata=dict(args.metadata) or None, include_ended=args.include_ended,
        template=args.template, limit=args.limit, next_token=args.next_token)
    infos = [sbx.info for sbx in page]
    if args.json:
        listed = [info.model_dump(mode="json") for info in infos]
        io.print_json(listed if args.limit is None else
                      {"sandboxes": listed, "next_token": page.next_token})
        return 0
    if page.next_token is not None:
        io.err.write(f"more: --next-token {page.next_token}\n")
    rows = list_rows(infos, time.time())
    console = Console(file=io.out)
    if console.is_terminal:
        if rows:
            console.print(list_table(rows))
        else:
            Console(file=io.err).print("no sandboxes", style="dim")
    else:  # plain tab-separated lines for scripts that do not want JSON
        for row in rows:
            io.out.write("\t".join(row) + "\n")
    return 0


def _exec(client: Client, args: argparse.Namespace, io: _Streams) -> int:
    stdin = sys.stdin.read() if args.stdin else None
    sbx = client.sandboxes.connect(args.id)
    cmd = exec_command(args.cmd)
    env = dict(args.env) or None
    if args.json:
        result = sbx.exec(cmd, timeout_seconds=args.timeout, env=env, cwd=args.cwd,
                          stdin=stdin)
        io.print_json(result.model_dump(mode="json"))
        return exit_status(result)
    result = sbx.exec(cmd, timeout_seconds=args.timeout, env=env, cwd=args.cwd, stdin=stdin,
                      on_stdout=io.writer(io.out), on_stderr=io.writer(io.err))
    if result.timed_out:
        io.err.write(f"pandastack: the command timed out after {args.timeout:g}s "
                     "(--timeout) and was killed\n")
    if result.truncated:
        io.err.write("pandastack: the output was truncated by the sandbox\n")
    return exit_status(result)


def _kill(client: Client, args: argparse.Namespace, io: _Streams) -> int:
    for sandbox_id in args.ids:
        client.sandboxes.kill(sandbox_id)
        if not args.json:
            io.out.write(f"killed {sandbox_id}\n")
    if args.json:
        io.print_json({"killed": list(args.ids)})
    return 0


def _metrics(client: Client, args: argparse.Namespace, io: _Streams) -> int:
    m = client.sandboxes.connect(args.id).get_metrics()
    if args.json:
        io.print_json(m.model_dump(mode="json"))
        return 0
    mib = 1 << 20
    io.out.write(f"cpu     {m.cpu_percent:.1f}% of {m.cpu_count} vCPU over {m.window_ms} ms\n"
                 f"memory  {m.memory_used_bytes // mib} / {m.memory_total_bytes // mib} MiB\n"
                 f"disk    {m.disk_used_bytes // mib} / {m.disk_total_bytes // mib} MiB\n")
    return 0


# -- shell --------------------------------------------------------------------------------

_EXIT_RE = re.compile(r"^(exit|logout|quit)(\s+(-?\d+))?\s*$")


def shell_exit(line: str, last: int) -> int | None:
    """The status to leave the shell with if `line` is `exit [N]` (or logout, quit); else None."""
    match = _EXIT_RE.match(line.strip())
    if match is None:
        return None
    return int(match.group(3)) & 0xFF if match.group(3) else last


def shell_script(line: str, cwd: str, last: int, cwd_file: str) -> str:
    """The `sh -c` script for one shell line: go to `cwd` (or to / if it is gone), set `$?` to
    the previous line's status, run the line, then write the directory it ended in to
    `cwd_file` for the next line. The line stays on the script's first line, so the shell's
    messages say "line 1" as for a plain `sh -c`."""
    gone = shlex.quote(f"pandastack: {cwd} is gone, now in /")
    return (f"__pandastack_status() {{ return $1; }}; "
            f"cd -- {shlex.quote(cwd)} 2>/dev/null || {{ echo {gone} >&2; cd /; }}; "
            f"__pandastack_status {last & 0xFF}; {line}\n"
            f"__pandastack_rc=$?\n"
            f"pwd > {shlex.quote(cwd_file)} 2>/dev/null\nexit $__pandastack_rc\n")


def _shell(client: Client, args: argparse.Namespace, io: _Streams) -> int:
    sbx = client.sandboxes.connect(args.id)
    if args.cmd is not None or sys.stdin.isatty():
        return terminal(sbx, args.cmd)
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 (line editing and history for input())
        io.err.write(f"connected to {sbx.id}; `exit` or Ctrl-D leaves (the sandbox keeps "
                     "running)\n")
    cwd = sbx.exec("cd /work 2>/dev/null; pwd", timeout_seconds=30).stdout.strip() or "/"
    cwd_file = f"/tmp/.pandastack-shell-{secrets.token_hex(6)}"
    last = 0
    try:
        while True:
            try:
                line = input(f"{sbx.id}:{cwd}$ " if interactive else "")
            except EOFError:
                if interactive:
                    io.err.write("\n")
                return last
            except KeyboardInterrupt:  # at the prompt: a fresh prompt, as shells do
                io.err.write("\n")
                last = 130
                continue
            code = shell_exit(line, last)
            if code is not None:
                return code
            if not line.strip():
                continue
            last = _shell_line(sbx, shell_script(line, cwd, last, cwd_file), args.timeout, io)
            if last != 130:
                with contextlib.suppress(NotFoundError):
                    cwd = sbx.filesystem.read(cwd_file).decode(errors="replace").strip() or cwd
    finally:
        with contextlib.suppress(PandastackError):
            sbx.filesystem.remove(cwd_file)


def _shell_line(sbx: Sandbox, script: str, timeout: float, io: _Streams) -> int:
    """Run one line; its exit status. A failure that leaves the sandbox usable is reported
    and the shell goes on; one that means the sandbox is gone ends the shell."""
    try:
        result = sbx.exec(["/bin/sh", "-c", script], timeout_seconds=timeout,
                          on_stdout=io.writer(io.out), on_stderr=io.writer(io.err))
    except KeyboardInterrupt:
        io.err.write("\n^C (stopped waiting; the command may still be running in the "
                     "sandbox)\n")
        return 130
    except (NotFoundError, SandboxError, AuthError):
        raise  # the sandbox is gone or not running, or the key stopped working
    except PandastackError as exc:
        io.err.write(f"pandastack: {format_error(exc)}\n")
        return EXIT_EXEC_FAILED
    if result.timed_out:
        io.err.write(f"pandastack: timed out after {timeout:g}s and was killed\n")
    return exit_status(result)


# -- entry --------------------------------------------------------------------------------

_COMMANDS: dict[str, Callable[[Client, argparse.Namespace, _Streams], int]] = {
    "create": _create, "list": _list, "exec": _exec, "kill": _kill, "shell": _shell,
    "metrics": _metrics, **sandbox_ops.COMMANDS,
}


def run_client(args: argparse.Namespace, command: Callable[[Client, argparse.Namespace], int],
               transport: httpx.BaseTransport | None) -> int:
    """Run `command` with a client from the configuration; API errors become exit status 1
    (as JSON on stderr with `--json`)."""
    api_url: str | None = None
    try:
        config = resolve_config()
        api_url = config.api_url
        with Client(config.api_url, config.api_key, transport=transport) as client:
            return command(client, args)
    except PandastackError as exc:
        if getattr(args, "json", False):
            sys.stderr.write(json.dumps(error_json(exc)) + "\n")
        else:
            sys.stderr.write(f"error: {format_error(exc, api_url)}\n")
        return EXIT_API_ERROR


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack sandbox ...` command; returns the exit status.

    `transport` replaces httpx's (tests use a fake API).
    """
    io = _Streams()
    api_url: str | None = None
    failed = EXIT_EXEC_FAILED if args.sandbox_command == "exec" else EXIT_API_ERROR
    try:
        config = resolve_config()
        api_url = config.api_url
        with Client(config.api_url, config.api_key, transport=transport) as client:
            return _COMMANDS[args.sandbox_command](client, args, io)
    except PandastackError as exc:
        if getattr(args, "json", False):
            io.err.write(json.dumps(error_json(exc)) + "\n")
        else:
            io.err.write(f"error: {format_error(exc, api_url)}\n")
        return failed
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, and keep Python's exit-time
        # flush of stdout from complaining about it too.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
