"""`pandastack agent`: this host's runtime in its own process, serving the host API
(spec/host-openapi.json) to a control plane that holds the token of `--token-file`.

It listens on a unix socket (mode 0600) by default, in the state dir beside the sandboxes it
owns, or on TCP with `--listen HOST:PORT`. On SIGTERM it stops taking requests, lets the ones
in flight end (10 s at most) and closes the runtime: the VMs keep running, and the next agent
on the same state dir re-adopts them. The host and server modules are imported in `run`, so
that the parser is built on a client-only install.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import secrets
import signal
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from pandastack.host.config import HostConfig

log = logging.getLogger("pandastack.agent")

SOCKET_NAME = "agent.sock"
TOKEN_NAME = "agent.token"
# Longer than the host client keeps idle connections (server/hostclient/transport.py), so
# the agent never closes one the client is about to send on.
KEEP_ALIVE_S = 120
GRACEFUL_S = 10


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="serve this host's runtime over the host API")
    p.add_argument("--listen", default=None, metavar="unix:PATH | HOST:PORT",
                   help=f"where to listen (default: unix:<state dir>/{SOCKET_NAME})")
    p.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                   help=f"the control plane's token; made (random, mode 0600) if absent "
                        f"(default: <state dir>/{TOKEN_NAME})")
    p.add_argument("--log-level", default="info")


def default_listen(state_dir: Path) -> str:
    return f"unix:{state_dir / SOCKET_NAME}"


def default_token_file(state_dir: Path) -> Path:
    return state_dir / TOKEN_NAME


def load_token(path: Path) -> str:
    """The token in `path`, which is made with a new random one if it does not exist. A file
    that others may read is refused: the token is the host's only credential."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(f"token file {path} is open to others (mode {mode:04o}): "
                         f"chmod 600 {path}")
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def _unix_socket(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ValueError(f"{path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                    raise
            else:
                raise ValueError(f"another agent is listening on {path}")
        path.unlink()  # the socket of an agent that did not shut down (SIGKILL, a crash)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    return sock


def _tcp_socket(address: str) -> socket.socket:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {address!r}: expected unix:PATH or HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    return sock


def listening_socket(listen: str) -> socket.socket:
    """Bound, not yet listening: until the runtime has started (re-adopted its sandboxes),
    a client is refused at once rather than left waiting."""
    if listen.startswith("unix:"):
        return _unix_socket(Path(listen.removeprefix("unix:")))
    return _tcp_socket(listen)


def _exit_cleanly(_sig: int, _frame: object) -> NoReturn:
    # uvicorn raises the signal that stopped it again once it is done; this makes that a
    # clean exit (after the graceful shutdown), so the socket file is removed below.
    raise SystemExit(0)


async def serve(config: HostConfig, listen: str, token: str, log_level: str) -> None:
    import uvicorn

    from pandastack.host.api import create_host_app
    from pandastack.host.local import LocalHost
    from pandastack.host.runtime import HostRuntime

    runtime = HostRuntime(config, progress=lambda message: log.info("%s", message))
    app = create_host_app(LocalHost(runtime), token, manage_host=True)
    sock = listening_socket(listen)
    server = uvicorn.Server(uvicorn.Config(
        app, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_S, lifespan="on", proxy_headers=False))
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        log.info("host agent for %s listening on %s", config.sandboxes_dir, listen)
        await server.serve(sockets=[sock])
        if not server.started:  # the runtime did not start (uvicorn logged why)
            raise SystemExit(1)
    finally:
        sock.close()
        if listen.startswith("unix:"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listen.removeprefix("unix:"))


def run(args: argparse.Namespace) -> int:
    from pandastack.host.config import HostConfig

    config = HostConfig.from_env()
    state_dir = config.sandboxes_dir
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    listen = args.listen or default_listen(state_dir)
    token = load_token(args.token_file or default_token_file(state_dir))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(config, listen, token, args.log_level))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0

