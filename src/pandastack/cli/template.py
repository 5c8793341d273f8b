"""`pandastack template build|list|show (info)|delete|logs`: the team's own templates, through the
API (`list` shows the built-in ones too).

`build` reads a Dockerfile in pandastack's subset (FROM a pandastack template or an image, RUN,
COPY, ENV, WORKDIR, USER, CMD/ENTRYPOINT, ARG with `--build-arg NAME=VALUE`, multi-stage
builds), sends it with its COPY files, and follows the build: a spinner
with the current step and elapsed time, every log line above it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pandastack.rules import BUILD_ID_RE
from pandastack.sdk import Client, NotFoundError, PandastackError, resolve_config
from pandastack.sdk.errors import TemplateBuildError
from pandastack.wire.resources import TemplateBuildInfo

from .sandbox import format_error

__all__ = ["add_parser", "run"]

EXIT_API_ERROR = 1
EXIT_BUILD_FAILED = 2
# The lines the spinner shows: a build's steps, and its image's layers as they are pulled
# (pull.py's `layer N/M sha256:...: 25 % (...)`), which take the first minutes of a build.
STATUS_RE = re.compile(r"^(Step \d+/\d+|layer \d+/\d+ )")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("template", help="build and manage your team's templates",
                       description="Templates through the API server; a build runs inside a "
                                   "microVM on the server, step by step with a cache.",
                       epilog="exit status: 0 ok; 1 the API or the configuration said no; "
                              "2 the build failed (its log says which step).")
    ts = p.add_subparsers(dest="template_command", required=True, metavar="COMMAND")
    build = ts.add_parser("build", help="build a new version of a template from a Dockerfile")
    build.add_argument("context", nargs="?", default=".",
                       help="the folder COPY reads from (default: .)")
    build.add_argument("-f", "--file", default=None,
                       help="the Dockerfile (default: CONTEXT/Dockerfile)")
    build.add_argument("-n", "--name", required=True, help="the template's name")
    build.add_argument("--vcpus", type=int, default=1)
    build.add_argument("--memory-mb", type=int, default=512)
    build.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                       type=_build_arg, help="a value for the Dockerfile's ARG NAME "
                                             "(repeatable)")
    build.add_argument("--quiet", action="store_true",
                       help="no spinner and no log on stderr (the result only; a failure "
                            "still says which step)")
    build.add_argument("--no-wait", action="store_true",
                       help="print the build id and return at once")
    ts.add_parser("list", help="the built-in templates, then the team's (newest version "
                               "of each)")
    show = ts.add_parser("show", aliases=["info"],
                         help="a template's versions (with the ports its image exposes)")
    show.add_argument("name")
    delete = ts.add_parser("delete", help="delete a template (all versions, or --version)")
    delete.add_argument("name")
    delete.add_argument("--version", type=int, default=None)
    logs = ts.add_parser("logs", help="a build's log (follows a build under way)")
    logs.add_argument("which", metavar="NAME[:VERSION]|BUILD_ID",
                      help="a template (its newest version by default) or a build id")
    for sp in (build, ts.choices["list"], show, delete):
        sp.add_argument("--json", action="store_true", help="print JSON")


def _build_arg(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _print_info(info: TemplateBuildInfo, as_json: bool, console: Console) -> None:
    # The result on stdout (the log and the spinner are on stderr).
    if as_json:
        print(json.dumps(info.model_dump()))
    else:
        print(f"{info.name}:{info.version} {info.status} (build {info.build_id})")


def _build(client: Client, args: argparse.Namespace, console: Console) -> int:
    context = Path(args.context)
    dockerfile = Path(args.file) if args.file else context / "Dockerfile"
    if args.no_wait:
        info = client.templates.build(dockerfile, args.name, context_dir=context,
                                      vcpus=args.vcpus, memory_mb=args.memory_mb, wait=False,
                                      build_args=dict(args.build_arg))
        _print_info(info, args.json, console)
        return 0
    if args.quiet:
        try:
            info = client.templates.build(dockerfile, args.name, context_dir=context,
                                          vcpus=args.vcpus, memory_mb=args.memory_mb,
                                          build_args=dict(args.build_arg))
        except TemplateBuildError as exc:
            console.print(f"[red]build failed:[/red] {exc}", highlight=False)
            return EXIT_BUILD_FAILED
        _print_info(info, args.json, console)
        return 0
    started = time.monotonic()
    with console.status(f"building {args.name}") as status:
        def on_log(line: str) -> None:
            console.print(line, markup=False, highlight=False)
            if STATUS_RE.match(line):
                status.update(f"building {args.name}: {line[:80]} "
                              f"({time.monotonic() - started:.0f}s)")
        try:
            info = client.templates.build(dockerfile, args.name, context_dir=context,
                                          vcpus=args.vcpus, memory_mb=args.memory_mb,
                                          on_log=on_log, build_args=dict(args.build_arg))
        except TemplateBuildError as exc:
            console.print(f"[red]build failed:[/red] {exc}", highlight=False)
            return EXIT_BUILD_FAILED
    _print_info(info, args.json, console)
    return 0


def _list(client: Client, args: argparse.Namespace, console: Console) -> int:
    # The server lists the built-ins (its GET /v1/templates), so what is printed is what
    # that server offers, and every client of the API sees the same list.
    builtin = client.templates.builtin()
    infos = client.templates.list()
    if args.json:
        print(json.dumps([*({"name": b.name, "builtin": True, "default": b.default}
                            for b in builtin),
                          *({**i.model_dump(), "builtin": False} for i in infos)]))
        return 0
    table = Table("NAME", "VERSION", "STATUS", "BUILD", box=None)
    for b in builtin:
        table.add_row(b.name, "", "built-in (default)" if b.default else "built-in", "")
    for info in infos:
        table.add_row(info.name, str(info.version), info.status, info.build_id)
    Console().print(table)
    return 0


def _show(client: Client, args: argparse.Namespace, console: Console) -> int:
    template = client.templates.get(args.name)
    if args.json:
        print(json.dumps(template.model_dump()))
        return 0
    table = Table("VERSION", "STATUS", "STEPS", "CACHED", "PORTS", "BUILD", "ERROR", box=None)
    for v in template.versions:
        table.add_row(str(v.version), v.status, str(v.steps_total or ""),
                      str(v.steps_cached or ""), " ".join(v.exposed_ports), v.build_id,
                      (v.error or "")[:60])
    Console().print(table)
    return 0


def _delete(client: Client, args: argparse.Namespace, console: Console) -> int:
    client.templates.delete(args.name, args.version)
    if args.json:
        print(json.dumps({"deleted": args.name, "version": args.version}))
    return 0


def build_of(client: Client, which: str) -> str:
    """The build id that `which` names: itself (`tb-...`), or a template's `NAME[:VERSION]`
    (its newest version when none is given)."""
    if BUILD_ID_RE.match(which):
        return which
    name, _, version = which.partition(":")
    versions = client.templates.get(name).versions
    if version:
        found = [v for v in versions if str(v.version) == version]
        if not found:
            raise NotFoundError(f"template {name!r} has no version {version}", status=404,
                                code="not_found")
        return found[0].build_id
    return max(versions, key=lambda v: v.version).build_id


def _logs(client: Client, args: argparse.Namespace, console: Console) -> int:
    for line in client.templates.logs(build_of(client, args.which)):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    return 0


_COMMANDS = {"build": _build, "list": _list, "show": _show, "info": _show, "delete": _delete,
             "logs": _logs}


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    api_url: str | None = None
    try:
        config = resolve_config()
        api_url = config.api_url
        with Client(config.api_url, config.api_key) as client:
            return _COMMANDS[args.template_command](client, args, console)
    except PandastackError as exc:
        sys.stderr.write(f"error: {format_error(exc, api_url)}\n")
        return EXIT_API_ERROR
    except (OSError, ValueError) as exc:  # an unreadable or invalid Dockerfile
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_API_ERROR
