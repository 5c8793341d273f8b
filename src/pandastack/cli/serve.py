"""`pandastack serve`: the control plane on uvicorn, with the host runtime in-process."""

from __future__ import annotations

import argparse
import logging

from pandastack.server.settings import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve the REST API (host runtime in-process)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8080)")
    p.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from pandastack.server.app import create_app

    overrides: dict[str, object] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    settings = Settings.from_env().with_(**overrides)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                proxy_headers=False)
    return 0
