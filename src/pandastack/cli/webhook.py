"""`pandastack webhook create|list|delete|test|deliveries`: the team's webhooks through the
API server (the key as for `pandastack sandbox`).

    pandastack webhook create https://example.com/hook --events 'sandbox.*,quota.exceeded'
    pandastack webhook test wh_0123456789abcdef
    pandastack webhook deliveries wh_0123456789abcdef --json

`create` prints the signing secret, once. Exit status: 0 on success; 1 when the API says no
(or a test delivery was not delivered).
"""

from __future__ import annotations

import argparse
import json

from pandastack.sdk import Client

from .events import types_arg
from .sandbox import run_client

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("webhook", help="the team's webhooks (create, list, delete, test, "
                                       "deliveries)")
    ops = p.add_subparsers(dest="webhook_command", required=True)
    create = ops.add_parser("create", help="create a webhook (prints its secret once)")
    create.add_argument("url")
    create.add_argument("--events", required=True,
                        help="comma-separated types or prefixes (sandbox.*, *)")
    create.add_argument("--description", default=None)
    create.add_argument("--json", action="store_true")
    lst = ops.add_parser("list", help="the team's webhooks")
    lst.add_argument("--json", action="store_true")
    for name, text in (("delete", "delete a webhook, its queue and its log"),
                       ("test", "POST it a webhook.test event now"),
                       ("deliveries", "its delivery log, newest first")):
        op = ops.add_parser(name, help=text)
        op.add_argument("webhook_id")
        op.add_argument("--json", action="store_true")


def _dump(value: object) -> None:
    print(json.dumps(value, separators=(",", ":")))


def _run(client: Client, args: argparse.Namespace) -> int:
    command = args.webhook_command
    if command == "create":
        made = client.webhooks.create(args.url, types_arg(args.events) or [],
                                      description=args.description)
        if args.json:
            _dump(made.model_dump())
        else:
            print(f"{made.id}\t{made.url}\t{','.join(made.events)}")
            print(f"secret (shown once): {made.secret}")
    elif command == "list":
        hooks = client.webhooks.list()
        if args.json:
            _dump([h.model_dump() for h in hooks])
        for h in [] if args.json else hooks:
            print(f"{h.id}\t{h.url}\t{','.join(h.events)}")
    elif command == "delete":
        client.webhooks.delete(args.webhook_id)
        if args.json:
            _dump({"deleted": args.webhook_id})
    elif command == "test":
        d = client.webhooks.test(args.webhook_id)
        if args.json:
            _dump(d.model_dump())
        else:
            print(f"{d.status}\t{d.response_status or ''}\t{d.error or ''}".rstrip())
        return 0 if d.status == "delivered" else 1
    else:
        log = client.webhooks.deliveries(args.webhook_id)
        if args.json:
            _dump([d.model_dump() for d in log])
        for d in [] if args.json else log:
            print(f"{d.id}\t{d.event_type}\t{d.status}\t{d.attempts}\t"
                  f"{d.response_status or ''}\t{d.error or ''}".rstrip())
    return 0


def run(args: argparse.Namespace) -> int:
    return run_client(args, _run, None)
