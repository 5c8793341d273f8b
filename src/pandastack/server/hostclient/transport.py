"""How the host client reaches an agent: the address forms, the HTTP connection pool, the
per-call timeouts, and what a failure to reach it becomes (HostUnavailable, naming it)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from pandastack.hostport.errors import HostUnavailable


@dataclass(frozen=True)
class Timeouts:
    """Seconds a call waits for the agent's answer before it counts as unavailable.

    - `lookup`: host-side bookkeeping (get, list, placement, console, snapshot info): the
      agent answers from memory or one small file, so 10 s means it is stuck or gone.
    - `guest`: one guest-agent round trip (stat, list_dir, signal, stdin, a file chunk): the
      host's guest-agent client gives up after its own `agent_timeout_s` (30 s by default)
      and the agent then answers with that error, which must arrive before this expires.
    - `lifecycle`: create, snapshot, fork, pause, hibernate, wake, kill, code contexts: VM
      work that takes seconds under TCG, a fork of 16 or a kernel start minutes (a code
      context may take the guest's 600 s).
    - `connect`: a unix socket connects at once; TCP within a LAN in well under 5 s.

    Streams (exec, attach, code runs, builds) and template preparation have no read timeout
    but their operation's own: a quiet `sleep 3600` is not a stuck agent.
    """

    lookup: float = 10.0
    guest: float = 60.0
    lifecycle: float = 900.0
    connect: float = 5.0

    def of(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(read, connect=self.connect, pool=self.lifecycle)


def agent_tls(ca: Path | None = None, cert: Path | None = None,
              key: Path | None = None) -> ssl.SSLContext:
    """How the control plane speaks TLS to agents at https:// addresses (ADR 0048): their
    certificates verified with `ca` (None: the system's CAs), and `cert`/`key` presented to
    an agent that asks for a client certificate (`pandastack agent --tls-client-ca`)."""
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"the agents' CA {ca} (PANDASTACK_AGENT_CA): {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"the client certificate {cert} / {key} for agents "
                             f"(PANDASTACK_AGENT_CLIENT_CERT/_KEY): {exc}") from None
    return ctx


def parse_address(url: str, tls: ssl.SSLContext | None = None
                  ) -> tuple[httpx.AsyncHTTPTransport, str]:
    """`unix:/path/to.sock`, `http://host:port` (or `host:port`), `https://host:port`
    (verified with `tls`, else the system's CAs): the transport and the base URL of the
    requests."""
    # The agent's idle connections live longer (its keep-alive timeout, cli/agent.py) than
    # the pool keeps them, so the pool never sends on a connection the agent is closing.
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=64,
                          keepalive_expiry=60.0)
    if url.startswith("unix:"):
        path = url.removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"agent address {url!r}: a unix socket path must be absolute")
        return httpx.AsyncHTTPTransport(uds=path, limits=limits), "http://pandastack-agent"
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    parsed = httpx.URL(url)
    if not parsed.host or parsed.port is None:
        raise ValueError(f"agent address {url!r}: expected unix:PATH or HOST:PORT")
    return (httpx.AsyncHTTPTransport(limits=limits, verify=tls or True),
            str(parsed).rstrip("/"))


@contextlib.contextmanager
def reaching(address: str) -> Iterator[None]:
    """Turn the transport's failures (refused, reset, timed out, cut off midway) into
    HostUnavailable naming the agent."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise HostUnavailable(f"host agent at {address} did not answer in time "
                              f"({type(exc).__name__})") from exc
    except httpx.TransportError as exc:
        raise HostUnavailable(f"host agent at {address} cannot be reached: "
                              f"{type(exc).__name__}: {exc}") from exc
