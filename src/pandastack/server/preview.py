"""Sandbox ports on their own origin: the preview listener.

Every sandbox port is reached at `{port}-{sandbox id}.{domain}` on a listener of its own (the
API's port + 1 by default; PANDASTACK_PREVIEW_PORT, PANDASTACK_PREVIEW_URL), so that a page a
sandbox serves shares its origin with nothing else: not the API (whose session a dashboard
would keep), not another sandbox, not another port of the same sandbox. A browser gets there
with a signed URL (`POST /v1/sandboxes/{id}/ports/{port}/signed-url`); its first request sets
an access cookie of that host only (no Domain attribute, HttpOnly, SameSite=Lax; Secure on
https), which the page's own requests carry. Programs may send an API key instead.

What goes to the sandbox: the caller's cookies but the access cookie, no Authorization, no
`ps_*` parameters. What comes back: the sandbox's own headers, except that a Set-Cookie
loses any Domain attribute (a sandbox cannot set cookies for its neighbours' hosts by
header; a script can still set them for the parent domain through `document.cookie`, which
is why the access cookie of one port never opens another: each is checked against the
signature of its own sandbox and port).

The dispatch is by the listener a request came in on (`scope["server"]`): the preview
listener serves only sandbox ports (an unknown host is 404 `not_found`), the API's listener
only the API. Point a wildcard DNS name (`*.preview.example.com`) and a wildcard TLS
certificate at the preview listener, and set PANDASTACK_PREVIEW_URL to
`https://preview.example.com` (docs/security.md). Without one, `http://localhost:PORT`:
browsers resolve `*.localhost` to loopback.
"""

from __future__ import annotations

import logging
import re
import time
from http.cookies import CookieError, SimpleCookie
from typing import Any

from fastapi import FastAPI
from starlette.requests import HTTPConnection, Request
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from pandastack.hostport.errors import HostError

from .auth import key_from_headers
from .errors import ApiError, error_response, from_host_error
from .routes.ports import (
    REQUEST_DROP,
    WS_REQUEST_DROP,
    as_request,
    deny,
    forward_headers,
    forward_http,
    forward_ws,
    key_team,
    signed_team,
    target_sandbox,
)
from .service import SandboxService
from .settings import Settings
from .signing import EXPIRES_PARAM, SIGNATURE_PARAM

log = logging.getLogger("pandastack.server")

ACCESS_COOKIE = "ps_access"
HOST_RE = re.compile(r"^(?P<port>[1-9][0-9]{0,4})-(?P<sandbox>sbx-[0-9a-f]{12})\.(?P<domain>.+)$")
_DOMAIN_ATTR = re.compile(rb";\s*domain=[^;]*", re.IGNORECASE)


def preview_target(host_header: str, domain: str) -> tuple[int, str] | None:
    """(port, sandbox id) that a Host header names under `domain`, or None."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return None
    host = host.rsplit(":", 1)[0] if ":" in host else host
    found = HOST_RE.match(host)
    if found is None or found["domain"] != domain:
        return None
    port = int(found["port"])
    return (port, found["sandbox"]) if port <= 65535 else None


def _cookie_values(conn: HTTPConnection) -> list[str]:
    """Every access cookie the request carries (a page may have set more, for the parent
    domain: each is checked)."""
    values = []
    for header in conn.headers.getlist("cookie"):
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == ACCESS_COOKIE and value:
                values.append(value)
    return values


def _without_access_cookie(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept = []
    for name, value in headers:
        if name.lower() != b"cookie":
            kept.append((name, value))
            continue
        parts = [p for p in value.split(b";")
                 if p.strip().partition(b"=")[0] != ACCESS_COOKIE.encode()]
        if any(p.strip() for p in parts):
            kept.append((name, b";".join(parts).strip()))
    return kept


def _host_only(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, _DOMAIN_ATTR.sub(b"", v) if k in (b"set-cookie", b"set-cookie2") else v)
            for k, v in headers]


def access_cookie(expires: int, signature: str, *, secure: bool, now: float) -> bytes:
    cookie: SimpleCookie = SimpleCookie()
    cookie[ACCESS_COOKIE] = f"{expires}.{signature}"
    morsel = cookie[ACCESS_COOKIE]
    morsel["path"] = "/"
    morsel["httponly"] = True
    morsel["samesite"] = "Lax"
    morsel["max-age"] = str(max(0, int(expires - now)))
    if secure:
        morsel["secure"] = True
    return morsel.OutputString().encode("latin-1")


class PreviewAccess:
    """Who may reach a preview host, and the cookie a signed URL's first request sets."""

    def __init__(self, conn: HTTPConnection, service: SandboxService, sandbox_id: str,
                 port: int) -> None:
        self.conn = conn
        self.service = service
        self.sandbox_id = sandbox_id
        self.port = port
        self.set_cookie: bytes | None = None

    async def team(self, secure: bool, now: float) -> str:
        params = self.conn.query_params
        expires, signatures = params.getlist(EXPIRES_PARAM), params.getlist(SIGNATURE_PARAM)
        if expires or signatures:
            if len(expires) != 1 or len(signatures) != 1:
                raise ApiError(403, "forbidden",
                               "a signed URL needs one ps_expires and one ps_sig")
            team = signed_team(self.conn, self.service, self.sandbox_id, self.port,
                               expires[0], signatures[0])
            self.set_cookie = access_cookie(int(expires[0]), signatures[0], secure=secure,
                                            now=now)
            return team
        refused: ApiError | None = None
        for value in _cookie_values(self.conn):
            stamp, _, signature = value.partition(".")
            try:
                return signed_team(self.conn, self.service, self.sandbox_id, self.port,
                                   stamp, signature)
            except ApiError as exc:
                refused = exc
        if key_from_headers(as_request(self.conn)) is not None:
            return await key_team(self.conn)
        raise refused or ApiError(401, "unauthorized", "this sandbox port needs a signed URL "
                                  "(POST /v1/sandboxes/{id}/ports/{port}/signed-url) or an "
                                  "API key")


class PreviewDispatch:
    """The ASGI app `serve` runs: requests on the preview listener's port go to sandbox
    ports, every other to the API app (its lifespan included)."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.port = settings.preview_listener_port
        self.scheme, self.domain, _ = settings.preview_base

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") or (None, None)
        if scope["type"] not in ("http", "websocket") or not self.port or \
                server[1] != self.port:
            await self.app(scope, receive, send)
            return
        scope = {**scope, "app": self.app}
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            await self._websocket(scope, receive, send)

    def _target(self, conn: HTTPConnection) -> tuple[int, str]:
        found = preview_target(conn.headers.get("host", ""), self.domain)
        if found is None:
            raise ApiError(404, "not_found", "no sandbox port at this host name: "
                           f"{{port}}-{{sandbox id}}.{self.domain}")
        return found

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        service: SandboxService = self.app.state.service
        try:
            port, sandbox_id = self._target(request)
            access = PreviewAccess(request, service, sandbox_id, port)
            team = await access.team(self.scheme == "https", time.time())
            sandbox_id, ns_ip = await target_sandbox(service, team, sandbox_id)
            headers = _without_access_cookie(forward_headers(request, "", REQUEST_DROP))
            cookie = access.set_cookie

            def out(hs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
                kept = _host_only(hs)
                return [*kept, (b"set-cookie", cookie)] if cookie is not None else kept
            response: Any = await forward_http(request, service, sandbox_id, ns_ip, port, "",
                                               request.url.path.lstrip("/"),
                                               headers_in=headers, headers_out=out)
        except HostError as exc:
            api = from_host_error(exc)
            response = error_response(request, api.status, api.code, api.message, api.headers)
        except ApiError as exc:
            response = error_response(request, exc.status, exc.code, exc.message,
                                      exc.headers)
        except CookieError as exc:
            response = error_response(request, 400, "bad_request", str(exc), {})
        except Exception:  # a bug of ours: the envelope, as the API's middleware gives
            log.exception("unhandled error on the preview host %s",
                          request.headers.get("host"))
            response = error_response(request, 500, "internal", "internal error")
        await response(scope, receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = WebSocket(scope, receive, send)
        service: SandboxService = self.app.state.service
        try:
            port, sandbox_id = self._target(websocket)
            team = await PreviewAccess(websocket, service, sandbox_id, port).team(
                self.scheme == "https", time.time())
            sandbox_id, ns_ip = await target_sandbox(service, team, sandbox_id)
        except HostError as exc:
            await deny(websocket, from_host_error(exc))
            return
        except ApiError as exc:
            await deny(websocket, exc)
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in
                   _without_access_cookie(forward_headers(websocket, "", WS_REQUEST_DROP))]
        await forward_ws(websocket, service, sandbox_id, ns_ip, port, "",
                         websocket.url.path.lstrip("/"), headers_in=headers,
                         headers_out=_host_only)
