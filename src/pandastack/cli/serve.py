"""`pandastack serve`: the control plane on uvicorn, with the host runtime in-process, or
driving a separately started `pandastack agent` (`--agent`). The server is imported in `run`,
not here, so that the parser is built on a client-only install."""

from __future__ import annotations

import argparse
import logging
import socket
import ssl
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from pandastack.cli.tls import add_cert_options, cert_options

log = logging.getLogger("pandastack.server")
# Longer than clients and proxies in front keep an idle connection (httpx 5 s, Node 4-5 s,
# nginx's upstream keepalive_timeout 60 s), so the server never closes one a client is about
# to send on. At uvicorn's default, 5 s, a client that waited out a `Retry-After: 5` and sent
# its retry on the kept connection met the server's close instead ("Connection reset by
# peer": E2B's SDK, retrying a 503 as told).
KEEP_ALIVE_S = 75

if TYPE_CHECKING:
    from fastapi import FastAPI

    from pandastack.server.settings import Settings


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve the REST API (host runtime in-process, or an agent)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8080)")
    p.add_argument("--preview-port", type=int, default=None,
                   help="the listener of sandbox ports on their own origin (default: --port "
                        "+ 1; 0: none; PANDASTACK_PREVIEW_PORT)")
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
    add_cert_options(p, "tls",
                     cert_help="serve HTTPS with this certificate (chain) (PANDASTACK_TLS_CERT; "
                               "default: plain HTTP, for loopback or TLS terminated in front)",
                     key_help="the certificate's private key (PANDASTACK_TLS_KEY)")
    add_cert_options(p, "sandbox-tls",
                     cert_help="the sandbox listener's wildcard certificate, *.DOMAIN of "
                               "PANDASTACK_PREVIEW_URL (PANDASTACK_SANDBOX_TLS_CERT; default: "
                               "--tls-cert)",
                     key_help="its private key (PANDASTACK_SANDBOX_TLS_KEY)")
    p.add_argument("--agent-ca", type=Path, default=None, metavar="PEM",
                   help="the CA that issued the certificates of agents at https:// "
                        "addresses (PANDASTACK_AGENT_CA; default: the system's CAs)")
    add_cert_options(p, "agent-client",
                     cert_help="the certificate presented to agents that ask for one (mutual "
                               "TLS; PANDASTACK_AGENT_CLIENT_CERT)",
                     key_help="its private key (PANDASTACK_AGENT_CLIENT_KEY)")
    p.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    from pandastack.server.app import create_app
    from pandastack.server.settings import Settings

    overrides: dict[str, object] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.preview_port is not None:
        overrides["preview_port"] = args.preview_port
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
    for name in ("tls", "sandbox-tls", "agent-client"):
        overrides.update(cert_options(args, name))
    if args.agent_ca is not None:
        overrides["agent_ca"] = args.agent_ca
    settings = Settings.from_env().with_(**overrides)
    listener_tls(settings)  # a bad certificate file stops us here, before anything starts
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_app(create_app(settings), settings, args.log_level)
    return 0


def _listen(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle off (TCP_NODELAY) only on connections
    # whose socket says so, and with Nagle on, a response written in two parts (headers, body)
    # waits for the client's delayed ACK: ~40 ms on every request of a kept-alive connection.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def listener_tls(settings: Settings) -> ssl.SSLContext | None:
    """The SSL context of `serve`'s listeners (cli/tls.py); None: plain HTTP."""
    from pandastack.cli.tls import by_server_name, server_context

    if settings.tls_cert is None or settings.tls_key is None:
        return None
    ctx = server_context(settings.tls_cert, settings.tls_key)
    if settings.sandbox_tls_cert is not None and settings.sandbox_tls_key is not None:
        wildcard = server_context(settings.sandbox_tls_cert, settings.sandbox_tls_key,
                                  what="--sandbox-tls-cert/--sandbox-tls-key")
        by_server_name(ctx, settings.preview_base[1], wildcard)
    return ctx


def serve_app(app: FastAPI, settings: Settings, log_level: str, *,
              access_log: bool = True) -> None:
    """Run `app` on uvicorn as `serve` does: the API on its port and sandbox ports on the
    preview listener (server/preview/listener.py), one process and one event loop; the access
    log on, at `log_level`; signatures of signed URLs are redacted from it by the app
    (server/preview/signing.py). A preview port left to its default (the API's + 1) that is taken
    means no preview listener, said in the log; one set explicitly that is taken is an
    error, as the API's own port is. With `settings.tls_cert` both listeners speak TLS only
    (`listener_tls`)."""
    import uvicorn

    from pandastack.cli.tls import fixed
    from pandastack.server.preview.listener import PreviewDispatch
    from pandastack.tracing import SERVER_SERVICE, configure_from_env

    configure_from_env(SERVER_SERVICE)  # OTLP spans where OTEL_EXPORTER_OTLP_ENDPOINT is set

    class _StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            app.state.stopping = True  # streams cut after the grace say why (server/web/sse.py)
            super().handle_exit(sig, frame)

    tls = listener_tls(settings)
    sockets = [_listen(settings.host, settings.port)]
    preview = settings.preview_listener_port
    if preview:
        try:
            sockets.append(_listen(settings.host, preview))
        except OSError as exc:
            if settings.preview_port is not None:
                raise
            log.warning("no preview listener (signed port URLs are refused): port %d: %s; "
                        "set PANDASTACK_PREVIEW_PORT", preview, exc)
            settings = settings.with_(preview_port=0)
            app.state.settings = settings
    # Bounded: an open stream or terminal must not hold a stop forever (uvicorn waits for
    # every connection without it).
    config = uvicorn.Config(PreviewDispatch(app, settings), log_level=log_level,
                            proxy_headers=False, access_log=access_log,
                            timeout_keep_alive=KEEP_ALIVE_S,
                            timeout_graceful_shutdown=settings.stop_grace_seconds,
                            ssl_context_factory=None if tls is None else fixed(tls))
    _StoppingServer(config).run(sockets=sockets)
