"""`pandastack agent`: this host's runtime in its own process, serving the host API
(spec/host-openapi.json) to a control plane that holds the token of `--token-file`.

It listens on a unix socket (mode 0600) by default, in the state dir beside the sandboxes it
owns, or on TCP with `--listen HOST:PORT`. On SIGTERM it stops taking requests, lets the ones
in flight end (10 s at most) and closes the runtime: the VMs keep running, and the next agent
on the same state dir re-adopts them. The host and server modules are imported in `run`, so
that the parser is built on a client-only install.

With `--db DSN` the agent is a member of the host registry (pandastack.registry, ADR 0019):
it migrates the schema, registers this host under its endpoint (`--advertise`, else what
`--listen` makes: `unix:PATH` or `http://HOST:PORT`), kills the re-adopted VMs whose leases
are not its own before it serves, heartbeats every `--heartbeat-s` with what it holds and
uses, takes a lease for every sandbox before its VM starts, and is fenced or pauses its VMs
as registry/membership.py describes. Without `--db` there is no registry.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit

from pandastack.cli.tls import add_cert_options, cert_options

if TYPE_CHECKING:
    from pandastack.host.config import HostConfig
    from pandastack.host.local import LocalHost
    from pandastack.hostport.protocols import RuntimePort
    from pandastack.registry import Usage

log = logging.getLogger("pandastack.agent")

SOCKET_NAME = "agent.sock"
TOKEN_NAME = "agent.token"
# Longer than the host client keeps idle connections (server/hostclient/transport.py), so
# the agent never closes one the client is about to send on.
KEEP_ALIVE_S = 120
GRACEFUL_S = 10
# vCPUs offered to sandboxes per CPU of the host, by default: a sandbox of agent-written code
# idles between the calls that drive it, and a busy one cannot take more than its own vCPUs.
VCPU_OVERCOMMIT = 4


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="serve this host's runtime over the host API")
    p.add_argument("--listen", default=None, metavar="unix:PATH | HOST:PORT",
                   help=f"where to listen (default: unix:<state dir>/{SOCKET_NAME})")
    p.add_argument("--token-file", type=Path, default=None, metavar="PATH",
                   help=f"the control plane's token; made (random, mode 0600) if absent "
                        f"(default: <state dir>/{TOKEN_NAME})")
    p.add_argument("--log-level", default="info")
    add_cert_options(p, "tls",
                     cert_help="serve the host API over TLS (a TCP --listen) with this "
                               "certificate the operator issued; API servers dial "
                               "https://HOST:PORT",
                     key_help="the certificate's private key")
    p.add_argument("--tls-client-ca", type=Path, default=None, metavar="PEM",
                   help="mutual TLS: refuse clients without a certificate this CA issued "
                        "(API servers present theirs: PANDASTACK_AGENT_CLIENT_CERT)")
    p.add_argument("--db", default=None, metavar="DSN",
                   help="the shared store (postgresql://...): register this host, heartbeat "
                        "and lease its sandboxes (default: no registry)")
    p.add_argument("--advertise", default=None, metavar="ENDPOINT",
                   help="the address API servers dial (default: from --listen, as "
                        "unix:PATH or http://HOST:PORT)")
    p.add_argument("--heartbeat-s", type=float, default=5.0, metavar="SECONDS",
                   help="how often to heartbeat (default: 5)")
    p.add_argument("--stale-after-s", type=float, default=15.0, metavar="SECONDS",
                   help="when a host that stopped heartbeating counts as gone (default: 15)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a placement label of this host (repeat for more)")
    p.add_argument("--vcpus", type=int, default=None, metavar="N",
                   help=f"vCPUs this host offers sandboxes (default: {VCPU_OVERCOMMIT} per "
                        f"CPU of the host)")
    p.add_argument("--memory-mb", type=int, default=None, metavar="MB",
                   help="memory this host offers sandboxes (default: the host's total)")
    p.add_argument("--object-store", default=None, metavar="URL",
                   help="the object store hosts share snapshots through "
                        "(sets PANDASTACK_OBJECT_STORE)")
    # Tests stand in an agent of another version with it (an upgrade's mixed cluster): the
    # host API protocol level it registers, serving the level before it too.
    p.add_argument("--host-protocol", type=int, default=None, help=argparse.SUPPRESS)


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
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only then (see cli/serve.py's _listen).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    return sock


def listening_socket(listen: str) -> socket.socket:
    """Bound, not yet listening: until the runtime has started (re-adopted its sandboxes),
    a client is refused at once rather than left waiting."""
    if listen.startswith("unix:"):
        return _unix_socket(Path(listen.removeprefix("unix:")))
    return _tcp_socket(listen)


def endpoint_of(listen: str, advertise: str | None, *, tls: bool = False) -> str:
    """What the registry records and API servers dial: `--advertise`, else the listening
    address as the host client spells it (https:// when the agent serves TLS)."""
    if advertise:
        return advertise
    if listen.startswith("unix:"):
        return f"unix:{Path(listen.removeprefix('unix:')).resolve()}"
    scheme = "https" if tls else "http"
    host, _, port = listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        raise ValueError(f"--listen {listen}: an address on every interface is no endpoint "
                         f"to dial: give --advertise {scheme}://HOST:{port}")
    return f"{scheme}://{host}:{port}"


def listener_tls(args: argparse.Namespace | None, listen: str) -> ssl.SSLContext | None:
    """The agent's TLS (ADR 0048), from `--tls-cert/--tls-key` and, for mutual TLS,
    `--tls-client-ca`; None: plain HTTP (a unix socket, or a TCP one on a trusted link)."""
    from pandastack.cli.tls import TLSFilesError, server_context

    pair = cert_options(args, "tls")
    cert, key = pair.get("tls_cert"), pair.get("tls_key")
    client_ca = getattr(args, "tls_client_ca", None)
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None or key is None:
        raise TLSFilesError("--tls-cert and --tls-key go together (and --tls-client-ca "
                            "needs them)")
    if listen.startswith("unix:"):
        raise TLSFilesError("TLS is for a TCP --listen HOST:PORT; a unix socket is "
                            "guarded by its file mode")
    return server_context(cert, key, client_ca=client_ca)


def with_peer_tls(config: HostConfig, args: argparse.Namespace) -> HostConfig:
    """`config` with the certificate of the agent's streams to other agents (a migration's
    memory, a direct fork's snapshot; ADR 0048, addendum): with mutual TLS on its host API,
    the same files, checked now to pass as a server's and a client's certificate both.
    Without `--tls-client-ca` those streams stay plain TCP guarded by one-time tokens."""
    from dataclasses import replace

    from pandastack.host.config import PeerCerts
    from pandastack.host.runtime.channel import PeerTLS

    pair = cert_options(args, "tls")
    cert, key = pair.get("tls_cert"), pair.get("tls_key")
    client_ca = getattr(args, "tls_client_ca", None)
    if cert is None or key is None or client_ca is None:
        return config
    certs = PeerCerts(cert, key, client_ca)
    PeerTLS(certs).check()
    return replace(config, peer_tls=certs)


def parse_labels(labels: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in labels:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _mem_total_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def host_usage(local: LocalHost) -> Callable[[], Awaitable[Usage]]:
    """What the heartbeat reports: the templates built or snapshotted here, the sandboxes
    (hibernated ones included) and the vCPUs and memory of those with a VM."""
    from pandastack.host.runtime.records import SandboxRecord
    from pandastack.registry import Usage

    runtime = local.runtime

    def measure(awake: list[str], count: int) -> Usage:
        names = {info.template for info in runtime.snapshots.all(include_internal=True)}
        root = runtime.config.templates_dir
        if root.is_dir():
            names |= {d.name for d in root.iterdir() if any(d.glob("*/template.json"))}
        vcpus = memory_mb = 0
        for sid in awake:
            try:
                record = SandboxRecord.load(runtime.sandboxes_dir / sid / "sandbox.json")
            except (OSError, ValueError, KeyError, TypeError):  # killed meanwhile
                continue
            vcpus, memory_mb = vcpus + record.vcpus, memory_mb + record.memory_mb
        return Usage(templates=tuple(sorted(names)), sandboxes=count, used_vcpus=vcpus,
                     used_memory_mb=memory_mb)

    async def usage() -> Usage:
        sandboxes = runtime.list()
        awake = [s.id for s in sandboxes if s.state != "hibernated"]
        return await asyncio.to_thread(measure, awake, len(sandboxes))

    return usage


def with_registry(local: LocalHost, args: argparse.Namespace, listen: str,
                  state_dir: Path) -> RuntimePort:
    """The host port under leases, its membership registered at `args.db` (migrated
    first)."""
    import pandastack
    from pandastack.hostport.compat import OURS, Levels
    from pandastack.registry import Registry
    from pandastack.registry.leased import LeasedHost
    from pandastack.registry.membership import HostFacts, Membership
    from pandastack.server.store.db import make_engine, migrate

    engine = make_engine(args.db)
    migrate(engine)
    vcpus = args.vcpus or VCPU_OVERCOMMIT * (os.cpu_count() or 1)
    memory_mb = args.memory_mb or _mem_total_mb()
    if vcpus < 1 or memory_mb < 1:
        raise ValueError("--vcpus and --memory-mb must be positive")
    endpoint = endpoint_of(listen, args.advertise,
                           tls=getattr(args, "tls_cert", None) is not None)
    facts = HostFacts(endpoint=endpoint, vcpus=vcpus,
                      memory_mb=memory_mb,
                      disk_mb=shutil.disk_usage(state_dir).free // (1 << 20),
                      labels=parse_labels(args.label), version=pandastack.__version__,
                      levels=OURS if args.host_protocol is None
                      else Levels.speaking(args.host_protocol))
    membership = Membership(Registry(engine), facts, local, heartbeat_s=args.heartbeat_s,
                            stale_after_s=args.stale_after_s, usage=host_usage(local))
    return LeasedHost(local, membership)


def _exit_cleanly(_sig: int, _frame: object) -> NoReturn:
    # uvicorn raises the signal that stopped it again once it is done; this makes that a
    # clean exit (after the graceful shutdown), so the socket file is removed below.
    raise SystemExit(0)


def migration_host(listen: str, advertise: str | None) -> str:
    """Where memory of sandboxes migrating here arrives (ADR 0023): the address API servers
    dial, which the other agents reach too; loopback for an agent on a unix socket."""
    for endpoint in (advertise, None if listen.startswith("unix:") else f"http://{listen}"):
        host = urlsplit(endpoint).hostname if endpoint else None
        if host and host not in ("0.0.0.0", "::"):
            return host
    return "127.0.0.1"


async def serve(config: HostConfig, listen: str, token: str, log_level: str,
                args: argparse.Namespace | None = None) -> None:
    import uvicorn

    from pandastack.cli.tls import fixed
    from pandastack.host.api import create_host_app
    from pandastack.host.local import LocalHost
    from pandastack.host.runtime import HostRuntime
    from pandastack.metrics_access import MetricsAccess
    from pandastack.tracing import AGENT_SERVICE, configure_from_env

    configure_from_env(AGENT_SERVICE)  # OTLP spans where OTEL_EXPORTER_OTLP_ENDPOINT is set
    runtime = HostRuntime(config, progress=lambda message: log.info("%s", message))
    local = LocalHost(runtime, migration_host=migration_host(
        listen, args.advertise if args is not None else None))
    host: RuntimePort = local
    if args is not None and args.db:
        host = with_registry(local, args, listen, config.sandboxes_dir)
    app = create_host_app(host, token, manage_host=True,
                          metrics_access=MetricsAccess.of(listen), admission=runtime.admission)
    tls = listener_tls(args, listen)
    sock = listening_socket(listen)
    server = uvicorn.Server(uvicorn.Config(
        app, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_S, lifespan="on", proxy_headers=False,
        ssl_context_factory=None if tls is None else fixed(tls)))
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
    from pandastack.cli.tls import TLSFilesError
    from pandastack.host.config import HostConfig
    from pandastack.hostport.errors import SetupError

    if getattr(args, "object_store", None):
        os.environ["PANDASTACK_OBJECT_STORE"] = args.object_store
    config = HostConfig.from_env()
    state_dir = config.sandboxes_dir
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    listen = args.listen or default_listen(state_dir)
    try:  # before anything starts: a typo or a bad certificate is not worth a traceback
        listener_tls(args, listen)
        config = with_peer_tls(config, args)
        if args.db:
            endpoint_of(listen, args.advertise, tls=args.tls_cert is not None)
            parse_labels(args.label)
    except (ValueError, TLSFilesError, SetupError) as exc:
        print(f"pandastack agent: {exc}")
        return 2
    token = load_token(args.token_file or default_token_file(state_dir))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.tls_cert is not None and config.peer_tls is None:
        log.warning("without --tls-client-ca, live migrations and direct forks stream to "
                    "other agents in clear TCP: keep the agents on a private network")
    try:
        asyncio.run(serve(config, listen, token, args.log_level, args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0

