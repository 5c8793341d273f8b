"""`pandastack serve`: the control plane on uvicorn, with the host runtime in-process, or
driving a separately started `pandastack agent` (`--agent`). The server is imported in `run`,
not here, so that the parser is built on a client-only install."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from pandastack.server.settings import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve the REST API (host runtime in-process, or an agent)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8080)")
    p.add_argument("--agent", action="append", default=None, metavar="unix:PATH|URL",
                   help="drive this `pandastack agent` instead of a host runtime in this "
                        "process; repeat it for a pool of hosts (PANDASTACK_AGENT, "
                        "comma-separated)")
    p.add_argument("--agent-token-file", default=None, metavar="PATH",
                   help="the agent's token (PANDASTACK_AGENT_TOKEN_FILE; default: the "
                        "agent's default token file)")
    p.add_argument("--db", default=None, metavar="DSN",
                   help="the database (PANDASTACK_DB; default: SQLite in the home dir); "
                        "postgresql://... for API servers that share one")
    p.add_argument("--no-local-agent", action="store_true",
                   help="drive the agents registered in --db's host registry (each started "
                        "with `pandastack agent --db`), no host in this process "
                        "(PANDASTACK_CLUSTER=1)")
    p.add_argument("--host-stale-seconds", type=float, default=None,
                   help="a host whose heartbeat is this old is lost (default 15)")
    p.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    from pandastack.server.app import create_app
    from pandastack.server.settings import Settings

    overrides: dict[str, object] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.agent is not None:
        overrides["agent"] = ",".join(args.agent)
    if args.db is not None:
        overrides["db_url"] = args.db
    if args.no_local_agent:
        overrides["cluster"] = True
    if args.host_stale_seconds is not None:
        overrides["host_stale_seconds"] = args.host_stale_seconds
    if args.agent_token_file is not None:
        overrides["agent_token_file"] = Path(args.agent_token_file)
    settings = Settings.from_env().with_(**overrides)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_app(create_app(settings), settings, args.log_level)
    return 0


def serve_app(app: FastAPI, settings: Settings, log_level: str) -> None:
    """Run `app` on uvicorn as `serve` does: its access log on, at `log_level`; signatures of
    signed URLs are redacted from it by the app (server/signing.py)."""
    import uvicorn

    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level,
                proxy_headers=False)
