"""Sandbox ports on their own origin: the preview listener.

Every sandbox port is reached at `{port}-{sandbox id}.{domain}` on a listener of its own (the
API's port + 1 by default; PANDASTACK_PREVIEW_PORT, PANDASTACK_PREVIEW_URL), so that a page a
sandbox serves shares its origin with nothing else: not the API (whose session a dashboard
would keep), not another sandbox, not another port of the same sandbox. A browser gets there
with a signed URL (`POST /v1/sandboxes/{id}/ports/{port}/signed-url`); its first request sets
an access cookie of that host only (no Domain attribute, HttpOnly, SameSite=Lax; Secure on
https), which the page's own requests carry. Programs may send an API key instead.

The access cookie alone opens a WebSocket handshake or a state-changing request (anything
but GET, HEAD, OPTIONS) only when the browser says the port's own page sent it (`Origin`):
SameSite=Lax still sends it from every host under the same registrable domain, so another
tenant's page could otherwise drive this app with its visitor's cookie. A request without
`Origin` comes from no browser's page: it needs the signed URL or a key.

What goes to the sandbox: the caller's cookies but the access cookie, no Authorization, no
`ps_*` parameters. What comes back: the sandbox's own headers, except that a Set-Cookie
loses any Domain attribute, read as browsers read attributes (a sandbox cannot set cookies
for its neighbours' hosts by header; a script can still set them for the parent domain
through `document.cookie`, which is why the access cookie of one port never opens another:
each is checked against the signature of its own sandbox and port).

The dispatch is by the listener a request came in on (`scope["server"]`): the preview
listener serves only sandbox ports (an unknown host is 404 `not_found`), the API's listener
only the API. Point a wildcard DNS name (`*.preview.example.com`) and a wildcard TLS
certificate at the preview listener, and set PANDASTACK_PREVIEW_URL to
`https://preview.example.com` (docs/security.md). Without one, `http://localhost:PORT`:
browsers resolve `*.localhost` to loopback.

E2B's SDKs use the same listener (compat/e2b/listener.py): they name a sandbox port by the
headers `E2b-Sandbox-Id` / `E2b-Sandbox-Port` (E2B_SANDBOX_URL) or by the same host names
(E2B_DOMAIN). Ports 49983 and 49999 are E2B's daemon and code interpreter, answered by the
room; on any other port E2B's traffic token is one more credential, and E2B's headers are
never forwarded. A request in E2B's terms gets its errors in E2B's shape.
"""

from __future__ import annotations

import logging
import re
import time
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.requests import HTTPConnection, Request
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from pandastack.hostport.errors import HostError

from ..accounts.auth import key_from_headers
from ..compat.e2b.errors import E2bError, e2b_response
from ..compat.e2b.listener import (
    E2B_PORTS,
    FORWARD_DROP,
    E2bListener,
    resolve_target,
    speaks_e2b,
    token_team,
)
from ..routes.ports import (
    REQUEST_DROP,
    WS_REQUEST_DROP,
    as_request,
    forward_headers,
    forward_http,
    forward_ws,
    key_team,
    signed_team,
    target_sandbox,
)
from ..sandboxes.service import SandboxService
from ..settings import Settings
from ..web.errors import ApiError, error_response, from_host_error
from .signing import EXPIRES_PARAM, SIGNATURE_PARAM

log = logging.getLogger("pandastack.server")

ACCESS_COOKIE = "ps_access"
HOST_RE = re.compile(r"^(?P<port>[1-9][0-9]{0,4})-(?P<sandbox>sbx-[0-9a-f]{12})\.(?P<domain>.+)$")
# Methods a page may send across origins without changing anything: the cookie opens them
# whatever the Origin (a cross-origin page cannot read the answer).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# Browsers trim spaces and tabs around an attribute's name (RFC 6265 5.2); trimming every
# control character too only ever drops more, never keeps a Domain a browser would apply.
_ATTR_TRIM = bytes(range(0x21)) + b"\x7f"
# E2B's routing headers and tokens are credentials for us, never for the sandbox's server.
FORWARDED_DROP = REQUEST_DROP | FORWARD_DROP
WS_FORWARDED_DROP = WS_REQUEST_DROP | FORWARD_DROP


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


def without_domain(set_cookie: bytes) -> bytes:
    """A Set-Cookie value without its Domain attributes, split as a browser splits it: the
    cookie's own pair up to the first `;`, then attributes whose name is what precedes their
    first `=`, trimmed, in any case (`Domain =x`, `\tDOMAIN= x` and a bare `domain` too)."""
    pair, *attributes = set_cookie.split(b";")
    kept = [a for a in attributes
            if a.split(b"=", 1)[0].strip(_ATTR_TRIM).lower() != b"domain"]
    return b";".join([pair, *kept])


def _host_only(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, without_domain(v) if k in (b"set-cookie", b"set-cookie2") else v)
            for k, v in headers]


def _default_port(scheme: str, port: int | None) -> int | None:
    return port if port is not None else DEFAULT_PORTS.get(scheme)


def own_origin(conn: HTTPConnection, settings: Settings, target: tuple[int, str]) -> bool:
    """Whether the browser says this port's own page sent `conn`: an `Origin` of the port's
    host name, by the preview URL's scheme (or the one the request came in by) and its public
    port (or the one in the Host header: the port the browser connected to). `Origin: null`
    counts only beside `Sec-Fetch-Site: same-origin` (a same-origin form POST from a page
    under `Referrer-Policy: no-referrer`); no page can set either header."""
    origin = conn.headers.get("origin")
    if origin is None:
        return False
    if origin.strip() == "null":
        return conn.headers.get("sec-fetch-site") == "same-origin"
    scheme, domain, public_port = settings.preview_base
    own_scheme = {"ws": "http", "wss": "https"}.get(conn.url.scheme, conn.url.scheme)
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port
        host_port = urlsplit("//" + conn.headers.get("host", "")).port
    except ValueError:
        return False
    if parts.scheme not in (scheme, own_scheme) or parts.path or parts.query or \
            parts.fragment or parts.username is not None or parts.hostname is None or \
            preview_target(parts.hostname, domain) != target:
        return False
    ports = {_default_port(scheme, public_port), _default_port(parts.scheme, host_port)}
    return _default_port(parts.scheme, port) in ports


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

    async def team(self, secure: bool, now: float, cookie_opens: bool) -> str:
        """The team the request acts for; `cookie_opens`: whether the access cookie may
        stand alone (a safe method, or the port's own page sent it)."""
        team = token_team(self.conn, self.service, self.sandbox_id, self.port)
        if team is not None:  # E2B's traffic token
            return team
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
        cookies = _cookie_values(self.conn)
        if cookies and not cookie_opens:
            what = ("a WebSocket" if self.conn.scope["type"] == "websocket"
                    else f"a {self.conn.scope['method']} request")
            refused = ApiError(403, "forbidden", f"the access cookie opens {what} only from "
                               "this port's own page (by its Origin); a program needs the "
                               "signed URL or an API key")
            cookies = []
        for value in cookies:
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


async def deny_with(websocket: WebSocket, response: Any) -> None:
    """Refuse a handshake with `response` where the server can send one (uvicorn can)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        await websocket.close(1008)


class PreviewDispatch:
    """The ASGI app `serve` runs: requests on the preview listener's port go to sandbox
    ports, every other to the API app (its lifespan included)."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.port = settings.preview_listener_port
        self.scheme, self.domain, _ = settings.preview_base
        self.e2b = E2bListener(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") or (None, None)
        if scope["type"] not in ("http", "websocket") or not self.port or \
                server[1] != self.port:
            await self.app(scope, receive, send)
            return
        scope = {**scope, "app": self.app}
        conn = HTTPConnection(scope)
        try:
            target = self._target(conn)
        except (ApiError, E2bError) as exc:
            await self._refuse(conn, scope, receive, send, exc)
            return
        if target[0] in E2B_PORTS:  # E2B's daemon and code interpreter: answered here
            await self.e2b(scope, receive, send, *target)
            return
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            await self._websocket(scope, receive, send)

    def _cookie_opens(self, conn: HTTPConnection, target: tuple[int, str]) -> bool:
        if conn.scope["type"] == "http" and conn.scope["method"] in SAFE_METHODS:
            return True
        return own_origin(conn, self.settings, target)

    def _target(self, conn: HTTPConnection) -> tuple[int, str]:
        found = resolve_target(conn, preview_target(conn.headers.get("host", ""),
                                                    self.domain))
        if found is None:
            if speaks_e2b(conn):
                raise E2bError(400, "no sandbox named: send E2b-Sandbox-Id and "
                               f"E2b-Sandbox-Port, or use {{port}}-{{sandbox id}}.{self.domain}")
            raise ApiError(404, "not_found", "no sandbox port at this host name: "
                           f"{{port}}-{{sandbox id}}.{self.domain}")
        return found

    @staticmethod
    def _error(conn: HTTPConnection, exc: ApiError | E2bError) -> Any:
        """An error before or at a sandbox port: E2B-shaped to E2B's SDKs, else ours."""
        if isinstance(exc, E2bError) or speaks_e2b(conn):
            return e2b_response(exc.status, exc.message,
                                getattr(exc, "headers", None) or None)
        return error_response(as_request(conn), exc.status, exc.code, exc.message,
                              exc.headers)

    async def _refuse(self, conn: HTTPConnection, scope: Scope, receive: Receive, send: Send,
                      exc: ApiError | E2bError) -> None:
        if scope["type"] == "websocket":
            await deny_with(WebSocket(scope, receive, send), self._error(conn, exc))
            return
        await self._error(conn, exc)(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        service: SandboxService = self.app.state.service
        try:
            port, sandbox_id = self._target(request)
            access = PreviewAccess(request, service, sandbox_id, port)
            team = await access.team(self.scheme == "https", time.time(),
                                     self._cookie_opens(request, (port, sandbox_id)))
            sandbox_id, ns_ip = await target_sandbox(service, team, sandbox_id)
            headers = _without_access_cookie(forward_headers(request, "", FORWARDED_DROP))
            cookie = access.set_cookie

            def out(hs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
                kept = _host_only(hs)
                return [*kept, (b"set-cookie", cookie)] if cookie is not None else kept
            response: Any = await forward_http(request, service, sandbox_id, ns_ip, port, "",
                                               request.url.path.lstrip("/"),
                                               headers_in=headers, headers_out=out)
        except HostError as exc:
            response = self._error(request, from_host_error(exc))
        except (ApiError, E2bError) as exc:
            response = self._error(request, exc)
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
                self.scheme == "https", time.time(),
                self._cookie_opens(websocket, (port, sandbox_id)))
            sandbox_id, ns_ip = await target_sandbox(service, team, sandbox_id)
        except HostError as exc:
            await deny_with(websocket, self._error(websocket, from_host_error(exc)))
            return
        except (ApiError, E2bError) as exc:
            await deny_with(websocket, self._error(websocket, exc))
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in
                   _without_access_cookie(forward_headers(websocket, "", WS_FORWARDED_DROP))]
        await forward_ws(websocket, service, sandbox_id, ns_ip, port, "",
                         websocket.url.path.lstrip("/"), headers_in=headers,
                         headers_out=_host_only)
