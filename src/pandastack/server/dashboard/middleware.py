"""The web dashboard at `/dashboard` (docs/adr/0034-dashboard.md): its pages and assets, sign-in
and sign-out, and `/dashboard/api/v1/...`, where a signed-in page's requests are handed to the
REST API in process as the session's key.

It is the outermost middleware, so a request it forwards enters the API's whole stack (request
ids, metrics, body limits, auth, rate limit, error envelopes) once, with the API's own path.
The REST API itself never reads a cookie: what a forgery could reach is only what passes here,
where every request needs the session's CSRF token (a WebSocket, which cannot carry one, its
Origin)."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pandastack.rules import ErrorCode

from ..accounts.auth import SESSION_PRINCIPAL, Principal, authenticate
from ..settings import Settings
from ..store import Store
from ..web.errors import ApiError, error_response
from .session import COOKIE, CSRF_HEADER, SECURE_COOKIE, SESSION_SECONDS, Session, SessionSigner

PREFIX = "/dashboard"
API_PREFIX = PREFIX + "/api"
MAX_LOGIN_BODY = 4096
# What the pages may load: this origin only; xterm.js writes its own <style> elements, the
# only inline content allowed. No frames of the dashboard anywhere (clickjacking).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_STATIC_NAME = re.compile(r"^(?:vendor/)?[a-z0-9][a-z0-9_.-]{0,63}\.(?:js|css|svg)$")
# The port proxy's path form would serve a sandbox's pages on the dashboard's origin: never
# through a session (programs reach it with a key).
_NOT_FORWARDED = re.compile(r"^/v1/sandboxes/[^/]+/ports/")
_PTY_SOCKET = re.compile(r"^/v1/sandboxes/[^/]+/pty/[^/]+$")
_STRIPPED_HEADERS = {b"cookie", b"authorization", b"x-api-key", CSRF_HEADER.encode()}


def _asset(name: str) -> bytes | None:
    try:
        return (resources.files(__package__) / "static" / name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _route_path(scope: Scope) -> str:
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class DashboardMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._signer: tuple[Store, SessionSigner] | None = None
        self._assets: dict[str, bytes] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = _route_path(scope) if scope["type"] in ("http", "websocket") else ""
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send, path)
            return
        request = Request(scope, receive)
        if getattr(request.app.state, "store", None) is None:
            await error_response(request, 503, "unavailable", "starting")(scope, receive, send)
            return
        if path.startswith(API_PREFIX + "/"):
            await self._forward(request, scope, receive, send, path)
            return
        response = await self._page(request, path)
        await response(scope, receive, send)

    # -- sessions -----------------------------------------------------------------------

    def signer(self, store: Store) -> SessionSigner:
        # The secret is the database's: a new store (the app started again on another
        # database) has its own.
        if self._signer is None or self._signer[0] is not store:
            self._signer = (store, SessionSigner.for_store(store))
        return self._signer[1]

    def _session(self, request: Request) -> tuple[Session, Principal] | None:
        """The request's session and the caller it stands for, if its key is still valid."""
        store: Store = request.app.state.store
        session = self.signer(store).check(request.cookies.get(self._cookie(request)))
        if session is None:
            return None
        row = store.get_key(session.key_id)
        if row is None or row.revoked_at is not None:
            return None
        return session, Principal(key_id=row.id, team=row.team, admin=row.admin)

    def _secure(self, request: Request) -> bool:
        # No forwarded header is read (serve runs uvicorn without proxy headers): behind a
        # TLS proxy the public URL says https (PANDASTACK_PUBLIC_URL).
        settings: Settings = request.app.state.settings
        return request.url.scheme in ("https", "wss") or settings.api_url.startswith("https:")

    def _cookie(self, request: Request) -> str:
        """The session cookie's name: over https only the `__Host-` one counts, so a plain
        one planted for the parent domain is no session."""
        return SECURE_COOKIE if self._secure(request) else COOKIE

    def _set_cookie(self, request: Request, response: Response, session: Session) -> None:
        secure = self._secure(request)
        response.set_cookie(SECURE_COOKIE if secure else COOKIE, session.cookie,
                            max_age=SESSION_SECONDS, path="/", httponly=True,
                            samesite="strict", secure=secure)

    def _clear_cookie(self, request: Request, response: Response) -> None:
        secure = self._secure(request)
        response.delete_cookie(SECURE_COOKIE if secure else COOKIE, path="/", httponly=True,
                               samesite="strict", secure=secure)

    def _same_origin(self, scope: Scope) -> bool:
        """False if the request says (Origin, Sec-Fetch-Site) that another site's page sent
        it. A request with neither comes from no browser, so from no forged page."""
        site = _header(scope, b"sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = _header(scope, b"origin")
        if origin is None:
            return site is None or site in ("same-origin", "none")
        netloc = urlsplit(origin).netloc.lower()
        settings: Settings = scope["app"].state.settings
        return bool(netloc) and netloc in {(_header(scope, b"host") or "").lower(),
                                           urlsplit(settings.api_url).netloc.lower()}

    # -- pages --------------------------------------------------------------------------

    async def _page(self, request: Request, path: str) -> Response:
        method = request.method
        if path in (PREFIX, PREFIX + "/") and method in ("GET", "HEAD"):
            if path == PREFIX:
                return RedirectResponse(PREFIX + "/", 307)
            if self._session(request) is None:
                response: Response = RedirectResponse(PREFIX + "/login", 303)
                if self._cookie(request) in request.cookies:
                    self._clear_cookie(request, response)
                return response
            return self._static("index.html")
        if path == PREFIX + "/login":
            if method in ("GET", "HEAD"):
                if self._session(request) is not None:
                    return RedirectResponse(PREFIX + "/", 303)
                return self._static("login.html")
            if method == "POST":
                return await self._login(request)
        if path == PREFIX + "/logout" and method == "POST":
            return self._logout(request)
        if path == PREFIX + "/session" and method == "GET":
            return self._session_info(request)
        if path.startswith(PREFIX + "/static/") and method in ("GET", "HEAD"):
            name = path.removeprefix(PREFIX + "/static/")
            if _STATIC_NAME.match(name) and ".." not in name:
                return self._static(name)
        return error_response(request, 404, "not_found", f"no dashboard page {path!r}")

    def _static(self, name: str) -> Response:
        body = self._assets.get(name)
        if body is None:
            body = _asset(name)
            if body is None:
                return Response("not found", 404, headers=PAGE_HEADERS, media_type="text/plain")
            self._assets[name] = body
        suffix = name[name.rfind("."):]
        return Response(body, headers=PAGE_HEADERS, media_type=STATIC_TYPES[suffix])

    async def _login(self, request: Request) -> Response:
        # A JSON body and a same-origin page: a form on another site can send neither, so no
        # one can sign a visitor in as themselves (login CSRF).
        if not self._same_origin(request.scope):
            return error_response(request, 403, "forbidden", "cross-site sign-in refused")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return error_response(request, 415, "bad_request", "send {\"key\": ...} as JSON")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_LOGIN_BODY:
                return error_response(request, 413, "payload_too_large", "body too large")
        try:
            data: Any = json.loads(body)
        except ValueError:
            return error_response(request, 400, "bad_request", "request body is not valid JSON")
        key = data.get("key") if isinstance(data, dict) else None
        if not isinstance(key, str):
            return error_response(request, 422, "validation_error", "key: a string is needed")
        store: Store = request.app.state.store
        try:
            who = authenticate(store, key.strip())
        except ApiError as exc:
            return error_response(request, exc.status, exc.code, exc.message)
        session = self.signer(store).issue(who.key_id)
        response = JSONResponse(self._describe(store, session, who),
                                headers={"Cache-Control": "no-store"})
        self._set_cookie(request, response, session)
        return response

    def _logout(self, request: Request) -> Response:
        found = self._session(request)
        if not self._same_origin(request.scope) or (
                found is not None
                and not self.signer(request.app.state.store).csrf_ok(
                    found[0], request.headers.get(CSRF_HEADER))):
            return error_response(request, 403, "forbidden", "missing or wrong CSRF token")
        response = Response(status_code=204)
        self._clear_cookie(request, response)
        return response

    def _session_info(self, request: Request) -> Response:
        found = self._session(request)
        if found is None:
            response = error_response(request, 401, "unauthorized", "not signed in")
            self._clear_cookie(request, response)
            return response
        session, who = found
        return JSONResponse(self._describe(request.app.state.store, session, who),
                            headers={"Cache-Control": "no-store"})

    def _describe(self, store: Store, session: Session, who: Principal) -> dict[str, Any]:
        row = store.get_key(who.key_id)
        return {"key_id": who.key_id, "key_name": row.name if row else None,
                "key_prefix": row.prefix if row else None, "team": who.team,
                "admin": who.admin, "expires_at": session.expires,
                "csrf_token": self.signer(store).csrf_token(session)}

    # -- the API, as the session's key --------------------------------------------------

    async def _forward(self, request: Request, scope: Scope, receive: Receive, send: Send,
                       path: str) -> None:
        rest = path.removeprefix(API_PREFIX)
        found = self._session(request)
        if found is None:
            response = error_response(request, 401, "unauthorized", "not signed in")
            if self._cookie(request) in request.cookies:
                self._clear_cookie(request, response)
            await response(scope, receive, send)
            return
        session, who = found
        if not self._same_origin(scope) or not self.signer(request.app.state.store).csrf_ok(
                session, request.headers.get(CSRF_HEADER)):
            await error_response(request, 403, "forbidden", "missing or wrong CSRF token")(
                scope, receive, send)
            return
        if not rest.startswith("/v1/") or _NOT_FORWARDED.match(rest):
            await error_response(request, 404, "not_found",
                                 "the dashboard forwards only /v1 routes")(scope, receive, send)
            return
        await self.app(self._inner_scope(scope, rest, who), receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        rest = path.removeprefix(API_PREFIX)
        request = Request({**scope, "type": "http"})

        async def refuse(status: int, code: ErrorCode, message: str) -> None:
            await receive()  # websocket.connect
            if "websocket.http.response" in scope.get("extensions", {}):
                response = error_response(request, status, code, message)
                await send({"type": "websocket.http.response.start", "status": status,
                            "headers": response.raw_headers})
                await send({"type": "websocket.http.response.body", "body": response.body})
            else:
                await send({"type": "websocket.close", "code": 1008})

        if not path.startswith(API_PREFIX + "/") or not _PTY_SOCKET.match(rest):
            await refuse(404, "not_found", "no such WebSocket")
            return
        if getattr(request.app.state, "store", None) is None:
            await refuse(503, "unavailable", "starting")
            return
        # A browser always sends Origin on a WebSocket and no page can forge it; cookies ride
        # along to a socket of any origin, so this is what holds the terminal.
        if _header(scope, b"origin") is None or not self._same_origin(scope):
            await refuse(403, "forbidden", "cross-origin WebSocket refused")
            return
        found = self._session(request)
        if found is None:
            await refuse(401, "unauthorized", "not signed in")
            return
        await self.app(self._inner_scope(scope, rest, found[1]), receive, send)

    def _inner_scope(self, scope: Scope, rest: str, who: Principal) -> Scope:
        path: str = scope["path"]
        inner_path = path[:len(path) - len(_route_path(scope))] + rest
        headers = [(k, v) for k, v in scope.get("headers", ())
                   if bytes(k).lower() not in _STRIPPED_HEADERS]
        return {**scope, "path": inner_path, "raw_path": quote(inner_path).encode(),
                "headers": headers, SESSION_PRINCIPAL: who}
