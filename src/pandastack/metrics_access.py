"""Who may read `/metrics` (Prometheus text) on the API server and on an agent (ADR 0026).

Bound to loopback (or a unix socket, whose file mode already limits who connects), anyone
who can connect may read it. Bound anywhere else it needs `Authorization: Bearer <token>`
with the configured token (`PANDASTACK_METRICS_TOKEN`), 401 without it; with no token
configured it is off (404), so that exposing the API never exposes its metrics by default.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

TOKEN_ENV = "PANDASTACK_METRICS_TOKEN"


def is_loopback(bind: str) -> bool:
    """`bind` as a server or agent takes it: `127.0.0.1`, `localhost`, `HOST:PORT`,
    `http://HOST:PORT`, `unix:PATH`."""
    if bind.startswith("unix:"):
        return True
    host = bind
    if "//" in bind:
        host = urlsplit(bind).hostname or ""
    elif bind.startswith("["):  # [V6]:PORT or [V6]
        host = bind[1:].partition("]")[0]
    elif bind.count(":") == 1:  # HOST:PORT (a bare IPv6 address has more colons)
        host = bind.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class MetricsAccess:
    loopback: bool
    token: str | None = None

    @classmethod
    def of(cls, bind: str, token: str | None = None) -> MetricsAccess:
        """The rule for a process bound at `bind`; the token from the environment unless
        given."""
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        return cls(loopback=is_loopback(bind), token=token or None)

    def check(self, authorization: str | None) -> None:
        """Raises the HTTP error that refuses the request (404: off; 401: token)."""
        if self.token is not None:
            scheme, _, given = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), self.token.encode()):
                raise HTTPException(401, "/metrics needs the metrics token "
                                         "(Authorization: Bearer ...)",
                                    headers={"WWW-Authenticate": "Bearer"})
            return
        if not self.loopback:
            raise HTTPException(404)


async def scrape(request: Request, registry: CollectorRegistry, access: MetricsAccess,
                 refresh: Callable[[], Awaitable[None]] | None = None) -> Response:
    """The registry in Prometheus text, after `refresh` set the gauges read at scrape time."""
    access.check(request.headers.get("authorization"))
    if refresh is not None:
        await refresh()
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
