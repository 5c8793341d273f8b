"""`pandastack registry login|logout|list`: the team's credentials for image registries, through
the API server (the key as for `pandastack sandbox`). Template builds FROM an image of a
registry the team logged in to pull with them.

    echo "$GHCR_TOKEN" | pandastack registry login ghcr.io --username acme-bot --password-stdin
    PANDASTACK_REGISTRY_PASSWORD=... pandastack registry login registry.example.com:5000 -u ci
    pandastack registry list [--json]
    pandastack registry logout ghcr.io

The password is never an argument (a process's arguments are visible to every user of the
machine and kept in shell histories): it comes from stdin (`--password-stdin`, one line),
`PANDASTACK_REGISTRY_PASSWORD`, or a prompt without echo. Exit status: 0 on success; 1 when
the API says no; 2 when no password was given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
import sys

from pandastack.sdk import Client

from .sandbox import run_client

__all__ = ["PASSWORD_ENV", "add_parser", "run"]

PASSWORD_ENV = "PANDASTACK_REGISTRY_PASSWORD"
EXIT_NO_PASSWORD = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("registry", help="the team's image registry credentials (login, "
                                        "logout, list)")
    ops = p.add_subparsers(dest="registry_command", required=True)
    login = ops.add_parser("login", help="store the team's credentials for a registry")
    login.add_argument("registry", help="host[:port]: ghcr.io, docker.io (Docker Hub), ...")
    login.add_argument("-u", "--username", required=True)
    login.add_argument("--password-stdin", action="store_true",
                       help=f"read the password from stdin (else ${PASSWORD_ENV}, else a "
                            "prompt)")
    login.add_argument("--json", action="store_true")
    lst = ops.add_parser("list", help="the registries the team has credentials for")
    lst.add_argument("--json", action="store_true")
    logout = ops.add_parser("logout", help="delete the team's credentials for a registry")
    logout.add_argument("registry")
    logout.add_argument("--json", action="store_true")


def read_password(args: argparse.Namespace) -> str | None:
    """The password from stdin, the environment, or a prompt (None: none given)."""
    if args.password_stdin:
        # One line, its line ending dropped: `echo "$TOKEN" |` must not send the newline.
        return sys.stdin.readline().rstrip("\r\n") or None
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    if sys.stdin.isatty():
        return getpass.getpass(f"password for {args.username} at {args.registry}: ") or None
    return None


def _time(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _run(client: Client, args: argparse.Namespace) -> int:
    command = args.registry_command
    if command == "login":
        password = read_password(args)
        if password is None:
            sys.stderr.write(f"error: no password: pass --password-stdin, set {PASSWORD_ENV},"
                             " or run in a terminal to be asked\n")
            return EXIT_NO_PASSWORD
        stored = client.registries.login(args.registry, args.username, password)
        if args.json:
            print(json.dumps(stored.model_dump(), separators=(",", ":")))
        else:
            print(f"logged in to {stored.registry} as {stored.username}")
    elif command == "list":
        rows = client.registries.list()
        if args.json:
            print(json.dumps([r.model_dump() for r in rows], separators=(",", ":")))
        for r in [] if args.json else rows:
            print(f"{r.registry}\t{r.username}\t{_time(r.updated_at)}")
    else:
        client.registries.logout(args.registry)
        if args.json:
            print(json.dumps({"logged_out": args.registry}, separators=(",", ":")))
        else:
            print(f"logged out of {args.registry}")
    return 0


def run(args: argparse.Namespace) -> int:
    return run_client(args, _run, None)
