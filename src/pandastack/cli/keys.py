"""`pandastack keys create|list|revoke`: works directly on the store (same DSN as the server),
so it needs no running server, but the server extra (imported in `run`, not here, so that the
parser is built on a client-only install)."""

from __future__ import annotations

import argparse
import datetime as dt

from rich.console import Console
from rich.table import Table

out = Console()
err = Console(stderr=True)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="manage API keys (directly in the database)")
    ks = p.add_subparsers(dest="keys_command", required=True)
    create = ks.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("--name", required=True)
    create.add_argument("--team", default="default")
    create.add_argument("--admin", action="store_true", help="may manage keys")
    ks.add_parser("list", help="list keys")
    revoke = ks.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("id")


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


def run(args: argparse.Namespace) -> int:
    from pandastack.server.auth import create_key
    from pandastack.server.bootstrap import private_database
    from pandastack.server.settings import Settings
    from pandastack.server.store import open_store

    dsn = Settings.from_env().dsn
    private_database(dsn)
    store = open_store(dsn)
    try:
        if args.keys_command == "create":
            key, secret = create_key(store, args.name, args.team, admin=args.admin)
            err.print(f"created key {key.id} ({key.name}, team {key.team}); "
                      "it is shown only this once:")
            print(secret)
            return 0
        if args.keys_command == "list":
            rows = [(k.id, k.name, k.team, k.prefix, "yes" if k.admin else "",
                     _when(k.created_at), _when(k.revoked_at)) for k in store.list_keys()]
            if out.is_terminal:
                table = Table("id", "name", "team", "prefix", "admin", "created", "revoked")
                for row in rows:
                    table.add_row(*row)
                out.print(table)
            else:  # plain tab-separated lines for scripts
                for row in rows:
                    print("\t".join(row))
            return 0
        if args.keys_command == "revoke":
            if store.revoke_key(args.id) is None:
                err.print(f"[red]error:[/red] no key {args.id}")
                return 1
            err.print(f"revoked {args.id}")
            return 0
        return 2
    finally:
        store.close()
