"""`pandastack keys create|list|revoke`: API keys, through the API server with an admin key
(the configuration as for `pandastack sandbox`), or with `--db` directly on the store (the
server's DSN: no server needed, e.g. before the first `serve`; needs the server extra, which
`run` imports, not this module, so that the parser is built on a client-only install).

    pandastack keys create --name ci --team my-team   # prints the key once, on stdout
    pandastack keys list [--json]
    pandastack keys revoke KEY_ID

Exit status: 0 on success; 1 when the API, the store or the configuration says no.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence

import httpx

from pandastack.sdk import Client, KeyInfo

from .sandbox import run_client
from .usage import print_table

__all__ = ["add_parser", "run"]

COLUMNS = ("id", "name", "team", "prefix", "created", "revoked")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="create, list and revoke API keys (admin key, or --db)")
    ks = p.add_subparsers(dest="keys_command", required=True)
    create = ks.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("--name", required=True)
    create.add_argument("--team", default=None,
                        help="its team (default: the admin key's; with --db: default)")
    create.add_argument("--admin", action="store_true",
                        help="may manage keys (with --db: the API makes team keys only)")
    ls = ks.add_parser("list", help="list keys of every team")
    revoke = ks.add_parser("revoke", help="revoke a key by id (idempotent)")
    revoke.add_argument("id")
    for q in (create, ls, revoke):
        q.add_argument("--json", action="store_true", help="print JSON for scripts")
        q.add_argument("--db", action="store_true",
                       help="work on the server's database directly (PANDASTACK_DB), not "
                            "through the API")


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


def _show(keys: Sequence[KeyInfo], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"keys": [k.model_dump(mode="json") for k in keys]},
                                    indent=2) + "\n")
        return
    print_table(COLUMNS, [(k.id, k.name, k.team, k.prefix, _when(k.created_at),
                           "yes" if k.revoked else "") for k in keys], "keys")


def _created(key_id: str, name: str, team: str, secret: str, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"id": key_id, "name": name, "team": team,
                                     "key": secret}) + "\n")
        return
    sys.stderr.write(f"created key {key_id} ({name}, team {team}); it is shown only this "
                     "once:\n")
    sys.stdout.write(secret + "\n")


def _through_api(client: Client, args: argparse.Namespace) -> int:
    if args.keys_command == "create":
        if args.admin:
            sys.stderr.write("error: the API makes team keys only; an admin key is made with "
                             "--db, on the server's database\n")
            return 1
        made = client.keys.create(args.name, team=args.team)
        _created(made.id, made.name, made.team, made.key, args.json)
    elif args.keys_command == "list":
        _show(client.keys.list(), args.json)
    elif args.keys_command == "revoke":
        client.keys.revoke(args.id)
        if args.json:
            sys.stdout.write(json.dumps({"revoked": args.id}) + "\n")
        else:
            sys.stderr.write(f"revoked {args.id}\n")
    return 0


def _in_database(args: argparse.Namespace) -> int:
    from pandastack.server.accounts.auth import create_key
    from pandastack.server.bootstrap import private_database
    from pandastack.server.routes.keys import to_key_info
    from pandastack.server.settings import Settings
    from pandastack.server.store import open_store

    dsn = Settings.from_env().dsn
    private_database(dsn)
    store = open_store(dsn)
    try:
        if args.keys_command == "create":
            key, secret = create_key(store, args.name, args.team or "default", admin=args.admin)
            _created(key.id, key.name, key.team, secret, args.json)
        elif args.keys_command == "list":
            _show([KeyInfo.model_validate(to_key_info(k).model_dump())
                   for k in store.list_keys()], args.json)
        elif args.keys_command == "revoke":
            if store.revoke_key(args.id) is None:
                sys.stderr.write(f"error: no key {args.id}\n")
                return 1
            sys.stderr.write(f"revoked {args.id}\n")
        return 0
    finally:
        store.close()


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run a parsed `pandastack keys` command; returns the exit status."""
    if args.db:
        return _in_database(args)
    return run_client(args, _through_api, transport)
