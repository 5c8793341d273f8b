"""The `pandastack sandbox` commands about one sandbox's state and reach (registered by
sandbox.py beside create, list, exec, kill, metrics and shell):

    pandastack sandbox info ID                 its record (state, size, expiry, host, volumes)
    pandastack sandbox logs ID                 the guest console and the guest agent's log
    pandastack sandbox pause|resume|hibernate|wake ID
    pandastack sandbox fork ID [--count N]     prints each child's id
    pandastack sandbox snapshot ID [--name N]  prints the snapshot's id
    pandastack sandbox ttl ID [SECONDS]        shows the lifecycle; with SECONDS, ends it
                                               that many seconds from now
    pandastack sandbox ports ID                TCP ports listening in the guest, with URLs
    pandastack sandbox url ID PORT [--signed [--ttl S]]

Every command takes `--json`; plain output is one value per line for scripts (ids, URLs), a
table on a terminal. Long work (a fork of many children) shows a spinner on stderr when it is
a terminal, unless `--quiet`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console

from pandastack.sdk import Client

from .args import positive_int

__all__ = ["COMMANDS", "add_parsers", "listening_ports"]

Command = Callable[[Client, argparse.Namespace, Any], int]
# /proc/net/tcp's state column: 0A is LISTEN.
LISTEN = "0A"
PORTS_SCRIPT = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is 1 to 65535")
    return value


def add_parsers(ss: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    made: list[argparse.ArgumentParser] = []

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = ss.add_parser(name, help=help_text)
        p.add_argument("id", metavar="ID")
        made.append(p)
        return p

    command("info", "a sandbox's record: state, size, expiry, host, volumes")
    command("logs", "the guest console log and the guest agent's log")
    for verb, text in (("pause", "pause a sandbox (its memory stays, its clock stops)"),
                       ("resume", "resume a paused sandbox"),
                       ("hibernate", "save a sandbox's memory to disk and stop its VM"),
                       ("wake", "restore a hibernated sandbox")):
        command(verb, text)
    fork = command("fork", "live copies of a running sandbox; prints each child's id")
    fork.add_argument("--count", type=positive_int, default=1, help="children (default 1)")
    fork.add_argument("--durable", action="store_true",
                      help="children on other hosts come from a snapshot in the object store")
    fork.add_argument("--quiet", action="store_true", help="no progress on stderr")
    snap = command("snapshot", "save a sandbox's memory and disk; prints the snapshot id")
    snap.add_argument("--name", help="a name of the team's choosing")
    ttl = command("ttl", "show the lifecycle; with SECONDS, end the sandbox that many seconds "
                         "from now")
    ttl.add_argument("seconds", type=positive_int, nargs="?", metavar="SECONDS")
    command("ports", "TCP ports listening in the guest, with their API URLs")
    url = command("url", "the API URL of a port in the sandbox (needs the API key), or a "
                         "signed one that needs none")
    url.add_argument("port", type=_port, metavar="PORT")
    url.add_argument("--signed", action="store_true", help="a URL that works without a key")
    url.add_argument("--ttl", type=positive_int, default=3600, metavar="SECONDS",
                     help="how long a signed URL works (default 3600)")
    for p in made:
        p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


def _dump(io: Any, value: Any) -> None:
    io.out.write(json.dumps(value, indent=2) + "\n")


def _fields(io: Any, pairs: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        io.out.write(f"{key:<{width}}  {value}\n")


def _info(client: Client, args: argparse.Namespace, io: Any) -> int:
    info = client.sandboxes.get(args.id)
    if args.json:
        _dump(io, info.model_dump(mode="json"))
        return 0
    pairs = [("id", info.id), ("state", info.state), ("template", info.template),
             ("vcpus", str(info.vcpus)), ("memory", f"{info.memory_mb} MiB"),
             ("created", _when(info.created_at)), ("expires", _when(info.expires_at)),
             ("persistent", "yes" if info.persistent else "no")]
    if info.host_id:
        pairs.append(("host", info.host_id))
    if info.snapshot:
        pairs.append(("snapshot", info.snapshot))
    for v in info.volumes:
        pairs.append(("volume", f"{v.name} at {v.mount_path}{' (ro)' if v.read_only else ''}"))
    for key, value in sorted(info.metadata.items()):
        pairs.append(("metadata", f"{key}={value}"))
    if info.ended_at is not None:
        pairs.append(("ended", f"{_when(info.ended_at)} ({info.end_reason or '-'})"))
    _fields(io, pairs)
    return 0


def _logs(client: Client, args: argparse.Namespace, io: Any) -> int:
    logs = client.sandboxes.connect(args.id).logs()
    if args.json:
        _dump(io, logs.model_dump(mode="json"))
        return 0
    io.out.write("== console\n" + logs.console.rstrip("\n") + "\n")
    io.out.write("== agent\n" + logs.agent.rstrip("\n") + "\n")
    return 0


def _state(verb: str) -> Command:
    def run(client: Client, args: argparse.Namespace, io: Any) -> int:
        sbx = client.sandboxes.connect(args.id)
        info = getattr(sbx, verb)()
        if args.json:
            _dump(io, info.model_dump(mode="json"))
        else:
            io.out.write(f"{info.id} {info.state}\n")
        return 0
    return run


@contextlib.contextmanager
def _progress(what: str, quiet: bool) -> Iterator[None]:
    console = Console(file=sys.stderr)
    if quiet or not console.is_terminal:
        yield
        return
    with console.status(what):
        yield


def _fork(client: Client, args: argparse.Namespace, io: Any) -> int:
    sbx = client.sandboxes.connect(args.id)
    with _progress(f"forking {args.id} into {args.count}", args.quiet):
        children = sbx.fork(args.count, durable=args.durable)
    if args.json:
        _dump(io, {"sandboxes": [c.info.model_dump(mode="json") for c in children]})
    else:
        for child in children:
            io.out.write(child.id + "\n")
    return 0


def _snapshot(client: Client, args: argparse.Namespace, io: Any) -> int:
    snapshot_id = client.sandboxes.connect(args.id).snapshot(args.name)
    if args.json:
        _dump(io, client.snapshots.get(snapshot_id).model_dump(mode="json"))
    else:
        io.out.write(snapshot_id + "\n")
    return 0


def _ttl(client: Client, args: argparse.Namespace, io: Any) -> int:
    sbx = client.sandboxes.connect(args.id)
    life = sbx.lifecycle() if args.seconds is None else sbx.set_timeout(args.seconds)
    if args.json:
        _dump(io, life.model_dump(mode="json"))
        return 0
    _fields(io, [("state", life.state), ("ttl", f"{life.ttl_seconds} s"),
                 ("expires", _when(life.expires_at)),
                 ("persistent", "yes" if life.persistent else "no"),
                 ("idle timeout", f"{life.idle_timeout_seconds} s"),
                 ("last activity", _when(life.last_activity_at))])
    return 0


def listening_ports(proc_net_tcp: str) -> list[int]:
    """The local ports in LISTEN state in the text of /proc/net/tcp and tcp6, sorted, once
    each (a port on both IPv4 and IPv6 is one port)."""
    ports: set[int] = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != LISTEN or ":" not in fields[1]:
            continue
        try:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except ValueError:
            continue
    return sorted(ports)


def _ports(client: Client, args: argparse.Namespace, io: Any) -> int:
    sbx = client.sandboxes.connect(args.id)
    result = sbx.exec(["sh", "-c", PORTS_SCRIPT], timeout_seconds=10)
    ports = listening_ports(result.stdout)
    urls = {p: sbx.get_url(p) for p in ports}
    if args.json:
        _dump(io, {"ports": [{"port": p, "url": urls[p]} for p in ports]})
    else:
        for port in ports:
            io.out.write(f"{port}\t{urls[port]}\n")
    return 0


def _url(client: Client, args: argparse.Namespace, io: Any) -> int:
    sbx = client.sandboxes.connect(args.id)
    address = sbx.signed_url(args.port, args.ttl) if args.signed else sbx.get_url(args.port)
    if args.json:
        _dump(io, {"port": args.port, "url": address, "signed": args.signed})
    else:
        io.out.write(address + "\n")
    return 0


COMMANDS: dict[str, Command] = {
    "info": _info, "logs": _logs, "fork": _fork, "snapshot": _snapshot, "ttl": _ttl,
    "ports": _ports, "url": _url,
    **{verb: _state(verb) for verb in ("pause", "resume", "hibernate", "wake")},
}
