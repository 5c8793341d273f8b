"""Exposed ports: HTTP to a TCP port inside the sandbox, through the server.

Two ways in. On the preview origin (server/preview/listener.py: its own listener, one origin per
sandbox port, `{port}-{sandbox id}.{preview domain}`), by a signed URL (then a cookie of that
host only) or an API key: what a browser uses. On the API's origin, the path form
`/v1/sandboxes/{id}/ports/{port}/{path}`, by an API key only: a convenience for programs.
A page served there shares the API's origin with every other sandbox's, so the path form
forwards no cookies either way, refuses service-worker scripts, drops
`Service-Worker-Allowed`, and serves every response under `Content-Security-Policy:
sandbox` (an opaque origin: the page reaches no storage, cookie or worker of the API's).

Either way the request goes to `http://{slot}:{port}/{path}?{query}`, where the slot address
is the one the sandbox's network namespace DNATs to the guest; a WebSocket handshake is
relayed to `ws://{slot}:{port}/{path}?{query}` (preview/wsproxy.py), with the same access rules.
Both bodies stream (nothing is buffered whole); hop-by-hop headers, the caller's credentials
(Authorization, X-API-Key, the preview's access cookie) and the `ps_expires`/`ps_sig`
parameters are not forwarded. A proxied request wakes a hibernated sandbox and counts as
activity; while its response streams (or its WebSocket is open), the idle reaper leaves the
sandbox alone.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import Annotated
from urllib.parse import unquote_to_bytes

import anyio
import httpx
from fastapi import APIRouter, Path, Request, Response, WebSocket
from starlette.requests import ClientDisconnect, HTTPConnection
from starlette.types import Receive, Scope, Send

from pandastack.hostport.errors import HostError
from pandastack.rules import SANDBOX_ID_RE
from pandastack.wire.sandboxes import ErrorEnvelope, SignedUrl, SignedUrlRequest

from ..accounts.auth import CurrentPrincipal, principal
from ..preview import wsproxy
from ..preview.signing import EXPIRES_PARAM, SIGNATURE_PARAM, SIGNED_PARAMS, UrlSigner
from ..sandboxes.service import SandboxService
from ..settings import Settings
from ..web.errors import ApiError, error_response, from_host_error, not_found
from ..web.jsonbody import StrictJsonRoute
from .deps import AppSettings, SandboxId, Service

log = logging.getLogger("pandastack.server")

router = APIRouter(tags=["ports"], route_class=StrictJsonRoute)

Port = Annotated[int, Path(ge=1, le=65535, description="TCP port inside the sandbox")]
ProxyPath = Annotated[str, Path(description="path on the sandbox's server (may be empty)")]

PROXY_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "proxy-connection",
})
# Never forwarded upstream: the caller's credentials for this API, and what httpx sets.
REQUEST_DROP = HOP_BY_HOP | {"host", "authorization", "x-api-key"}
# A WebSocket handshake's own headers: the upstream connection makes its own.
WS_REQUEST_DROP = REQUEST_DROP | {"sec-websocket-key", "sec-websocket-version",
                                  "sec-websocket-extensions", "sec-websocket-protocol"}
SIGNED_KEYS = frozenset(p.encode() for p in SIGNED_PARAMS)
# The path form on the API's origin: no cookies either way, no service workers, and pages in
# an opaque origin (what a browser would otherwise share with the API and every sandbox).
PATH_FORM_REQUEST_DROP = REQUEST_DROP | {"cookie"}
PATH_FORM_RESPONSE_DROP = frozenset({"set-cookie", "set-cookie2", "service-worker-allowed",
                                     "content-security-policy"})
PATH_FORM_CSP = (b"content-security-policy",
                 b"sandbox allow-scripts allow-forms allow-popups allow-modals "
                 b"allow-downloads")

#: What a response of the sandbox goes through on its way out: (name, value) pairs in, pairs
#: out (the name lowercased).
HeaderFilter = Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]]


def path_form_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers
            if k.decode("latin-1") not in PATH_FORM_RESPONSE_DROP] + [PATH_FORM_CSP]


class PortProxy:
    """The connection pool to sandbox ports (one per app), and the URL signer."""

    def __init__(self, settings: Settings, signer: UrlSigner) -> None:
        self.signer = signer
        self.timeout = httpx.Timeout(connect=settings.port_connect_timeout_seconds,
                                     read=settings.port_read_timeout_seconds,
                                     write=settings.port_read_timeout_seconds,
                                     pool=settings.port_connect_timeout_seconds)
        # A bare transport: no cookie jar, no redirects, no proxy from the environment.
        self.transport = httpx.AsyncHTTPTransport(
            retries=0, limits=httpx.Limits(max_connections=512, max_keepalive_connections=64,
                                           keepalive_expiry=5.0))

    async def aclose(self) -> None:
        await self.transport.aclose()


def _proxy_of(request: HTTPConnection) -> PortProxy:
    proxy: PortProxy = request.app.state.port_proxy
    return proxy


def _dropped(headers: list[tuple[bytes, bytes]], drop: frozenset[str]) -> set[str]:
    """`drop` plus the headers that a Connection header names (hop-by-hop as well)."""
    named = {token.strip().lower() for name, value in headers if name.lower() == b"connection"
             for token in value.decode("latin-1").split(",")}
    return set(drop) | named


def forward_headers(request: HTTPConnection, prefix: str,
                     drop_always: frozenset[str] = REQUEST_DROP) -> list[tuple[bytes, bytes]]:
    raw = list(request.headers.raw)
    drop = _dropped(raw, drop_always)
    headers = [(k, v) for k, v in raw if k.decode("latin-1").lower() not in drop
               and not k.lower().startswith(b"x-forwarded-")]
    client = request.client.host if request.client else ""
    scheme = {"ws": "http", "wss": "https"}.get(request.url.scheme, request.url.scheme)
    headers += [(b"x-forwarded-for", client.encode()),
                (b"x-forwarded-proto", scheme.encode())]
    if prefix:
        headers.append((b"x-forwarded-prefix", prefix.encode()))
    host = request.headers.get("host")
    if host:
        headers.append((b"x-forwarded-host", host.encode("latin-1")))
    return headers


def _upstream_target(request: HTTPConnection, prefix: str, path: str) -> bytes:
    """The path and query to send upstream, as the caller encoded them (minus ps_*)."""
    raw_path: bytes = request.scope.get("raw_path") or request.url.path.encode()
    marker = (prefix + "/").encode()
    at = raw_path.find(marker)
    rest = raw_path[at + len(marker):] if at >= 0 else httpx.URL(path=path).raw_path[1:]
    # Judged by the decoded name: the signature check reads `ps%5Fsig` as `ps_sig`, so
    # forwarding it by its raw spelling would hand the signature to the guest.
    query = b"&".join(item for item in request.scope.get("query_string", b"").split(b"&")
                      if item and unquote_to_bytes(item.split(b"=", 1)[0].replace(b"+", b" "))
                      not in SIGNED_KEYS)
    return b"/" + rest + (b"?" + query if query else b"")


def as_request(conn: HTTPConnection) -> Request:
    """An HTTP request's view of `conn` (headers, query, app, state), for what takes one."""
    if isinstance(conn, Request):
        return conn
    return Request({**conn.scope, "type": "http"})


async def key_team(request: HTTPConnection) -> str:
    """The team of the request's API key (401 otherwise)."""
    return (await principal(as_request(request))).team


def signed_team(request: HTTPConnection, service: SandboxService, sandbox_id: str, port: int,
                expires: str, signature: str) -> str:
    """The team of the sandbox a valid signature (for its `port`) names: 403 if it is not
    this server's or has expired, 429 past the sandbox's URL rate, 404 for no sandbox."""
    why = _proxy_of(request).signer.check(sandbox_id, port, expires, signature)
    if why is not None:
        raise ApiError(403, "forbidden", why)
    wait = request.app.state.rate_limiter.take(f"url:{sandbox_id}")
    if wait > 0:
        raise ApiError(429, "rate_limited", "too many requests for this sandbox's URLs",
                       {"Retry-After": str(max(1, math.ceil(wait)))})
    row = service.store.sandbox_by_id(sandbox_id) if SANDBOX_ID_RE.match(sandbox_id) else None
    if row is None:
        raise not_found(f"sandbox {sandbox_id!r}")
    return row.team


async def _path_form_team(request: HTTPConnection) -> str:
    """The path form's caller: an API key only (a signed URL is the preview origin's)."""
    if any(name in request.query_params for name in SIGNED_PARAMS):
        raise ApiError(403, "forbidden", "signed URLs are served on the preview origin "
                       "(`POST .../signed-url` gives one); on the API's origin a port takes "
                       "an API key")
    return await key_team(request)


class ProxyResponse(Response):
    """Streams the upstream response to the client, raw (content-encoding kept). Ends early
    when the client goes away; when the upstream fails mid-body, the connection is closed
    without completing the response, so the client sees it truncated, not complete."""

    def __init__(self, upstream: httpx.Response, cleanup: contextlib.AsyncExitStack,
                 where: str, headers_out: HeaderFilter | None = None) -> None:
        super().__init__(status_code=upstream.status_code)
        raw = list(upstream.headers.raw)
        drop = _dropped(raw, HOP_BY_HOP)
        kept = [(k.lower(), v) for k, v in raw if k.decode("latin-1").lower() not in drop]
        self.raw_headers = kept if headers_out is None else headers_out(kept)
        self._upstream = upstream
        self._cleanup = cleanup
        self._where = where

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        complete = False
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async with anyio.create_task_group() as tg:
                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_disconnect)
                try:
                    async for chunk in self._upstream.aiter_raw():
                        if chunk:
                            await send({"type": "http.response.body", "body": chunk,
                                        "more_body": True})
                    complete = True
                except httpx.HTTPError as exc:
                    log.warning("%s: the sandbox's response broke off: %s: %s", self._where,
                                type(exc).__name__, exc)
                tg.cancel_scope.cancel()
            if complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            with anyio.CancelScope(shield=True):
                await self._upstream.aclose()
                await self._cleanup.aclose()


async def target_sandbox(service: SandboxService, team: str, sandbox_id: str) -> tuple[str, str]:
    """(sandbox id, slot address) of the team's running sandbox: 404 as for any route, 409
    if it is not running (a hibernated one is woken) or has no network."""
    row, _ = await service.running(team, sandbox_id)  # 404 / 409; wakes a hibernated one
    ns_ip = (await service.placement(row.id)).ns_ip
    if not isinstance(ns_ip, str):
        raise ApiError(409, "conflict", f"sandbox {row.id} has no network")
    return row.id, ns_ip


async def forward_http(request: Request, service: SandboxService, sandbox_id: str, ns_ip: str,
                       port: int, prefix: str, path: str, *,
                       drop: frozenset[str] = REQUEST_DROP,
                       headers_in: list[tuple[bytes, bytes]] | None = None,
                       headers_out: HeaderFilter | None = None) -> Response:
    """The request sent on to the sandbox's port, its response streamed back. `prefix`: the
    part of the path that is ours (the rest is the sandbox server's); `headers_in` replaces
    the forwarded request headers; `headers_out` filters the response's."""
    proxy = _proxy_of(request)
    target = _upstream_target(request, prefix, path)
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    where = f"{request.method} {sandbox_id}:{port}"
    cleanup = contextlib.AsyncExitStack()
    await cleanup.enter_async_context(service.busy(sandbox_id))
    try:
        upstream_request = httpx.Request(
            request.method, httpx.URL(scheme="http", host=ns_ip, port=port, raw_path=target),
            headers=headers_in if headers_in is not None else
            forward_headers(request, prefix, drop),
            content=request.stream() if has_body else None,
            extensions={"timeout": proxy.timeout.as_dict()})
        upstream = await proxy.transport.handle_async_request(upstream_request)
    except (httpx.InvalidURL, httpx.LocalProtocolError) as exc:
        await cleanup.aclose()
        raise ApiError(400, "bad_request", f"cannot forward this request: {exc}") from None
    except httpx.HTTPError as exc:
        await cleanup.aclose()
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ApiError(502, "bad_gateway",
                       f"port {port} of sandbox {sandbox_id} did not answer ({detail})") from None
    except ClientDisconnect:
        await cleanup.aclose()
        raise ApiError(400, "bad_request", "the client went away mid-request") from None
    except BaseException:
        await cleanup.aclose()
        raise
    return ProxyResponse(upstream, cleanup, where, headers_out)


async def proxy_port(sandbox_id: SandboxId, port: Port, path: ProxyPath, request: Request,
                     service: Service) -> Response:
    team = await _path_form_team(request)
    if "service-worker" in request.headers:
        raise ApiError(403, "forbidden", "no service workers on the API's origin: serve the "
                       "app on the preview origin (a signed URL)")
    sandbox_id, ns_ip = await target_sandbox(service, team, sandbox_id)
    prefix = f"{request.scope.get('root_path', '')}/v1/sandboxes/{sandbox_id}/ports/{port}"
    return await forward_http(request, service, sandbox_id, ns_ip, port, prefix, path,
                              drop=PATH_FORM_REQUEST_DROP, headers_out=path_form_headers)


@router.post("/sandboxes/{sandbox_id}/ports/{port}/signed-url",
             operation_id="createSignedUrl", response_model=SignedUrl,
             summary="A URL that reaches the port without an API key until it expires",
             description="The URL carries `ps_expires` (UNIX seconds) and `ps_sig` (an "
                         "HMAC-SHA256 by the server over `sandbox_id:port:expires`) on the "
                         "port's own origin, `{port}-{sandbox_id}.{preview domain}` (the "
                         "server's preview listener, PANDASTACK_PREVIEW_URL); append any "
                         "path after its `/`. Its first request sets a cookie of that host, "
                         "so the page's own requests need no parameters. Anyone holding it "
                         "reaches the port until it expires; it cannot be revoked earlier. "
                         "409 where the server has no preview listener.")
async def signed_url(sandbox_id: SandboxId, port: Port, body: SignedUrlRequest,
                     who: CurrentPrincipal, service: Service, settings: AppSettings,
                     request: Request) -> SignedUrl:
    row = service.live(who.team, sandbox_id)
    if not settings.preview_listener_port:
        raise ApiError(409, "conflict", "this server has no preview listener "
                       "(PANDASTACK_PREVIEW_PORT=0): signed URLs are served there")
    expires, signature = _proxy_of(request).signer.sign(row.id, port, body.ttl_seconds)
    url = (preview_origin(settings, row.id, port) +
           f"/?{EXPIRES_PARAM}={expires}&{SIGNATURE_PARAM}={signature}")
    return SignedUrl(url=url, expires_at=float(expires))


def preview_origin(settings: Settings, sandbox_id: str, port: int) -> str:
    """`scheme://{port}-{sandbox id}.{domain}[:port]`: the port's own origin."""
    scheme, domain, public_port = settings.preview_base
    suffix = f":{public_port}" if public_port is not None else ""
    return f"{scheme}://{port}-{sandbox_id}.{domain}{suffix}"


# After signed-url: Starlette takes the first route that matches path and method.
PROXY_PATH = "/sandboxes/{sandbox_id}/ports/{port}/{path:path}"
PROXY_DESCRIPTION = (
    "Proxied to the TCP port inside the sandbox (HTTP, any method, HEAD too; both bodies "
    "streamed), with an API key of the sandbox's team: a convenience for programs. On the "
    "API's origin no cookie is forwarded either way, a service-worker script is refused "
    "(403), `Service-Worker-Allowed` is dropped and every response carries "
    "`Content-Security-Policy: sandbox ...` (the page runs in an opaque origin). Browsers "
    "use the port's own origin instead (a signed URL from `POST .../ports/{port}/signed-url`, "
    "served by the preview listener). The response is the sandbox server's own; errors of "
    "the API itself (auth, unknown sandbox, nothing listening: 502 `bad_gateway`) are the "
    "error envelope. `POST .../signed-url` itself is the API's, not proxied.")

for _method in PROXY_METHODS:
    router.add_api_route(
        PROXY_PATH, proxy_port, methods=[_method], name=f"proxy_port_{_method.lower()}",
        include_in_schema=_method != "HEAD",  # served; a bodiless GET needs no entry
        response_class=Response, summary="Reach a port inside the sandbox (HTTP)",
        description=PROXY_DESCRIPTION,
        responses={200: {"description": "the sandbox server's response",
                         "content": {"*/*": {}}},
                   502: {"model": ErrorEnvelope, "description": "nothing answered"}})


# -- WebSocket -----------------------------------------------------------------------------

async def deny(websocket: WebSocket, exc: ApiError) -> None:
    """Refuse the handshake with the error envelope as an HTTP response, where the server
    supports that (uvicorn does); else by closing before accepting (the client sees 403)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_response(
            as_request(websocket), exc.status, exc.code, exc.message, exc.headers))
    else:
        code = 1008 if exc.status < 500 else wsproxy.INTERNAL_ERROR
        await websocket.close(code, wsproxy.close_reason(exc.message))


async def proxy_port_ws(websocket: WebSocket, sandbox_id: str, port: str, path: str) -> None:
    """A WebSocket to the port by the path form: the caller is checked as for HTTP (an API
    key; refusals are the error envelope, as the handshake's HTTP response), no cookie
    goes either way; then relayed as `forward_ws` says."""
    service: SandboxService = websocket.app.state.service
    try:
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ApiError(422, "validation_error", "port: must be an integer in 1..65535")
        number = int(port)
        team = await _path_form_team(websocket)
        sandbox_id, ns_ip = await target_sandbox(service, team, sandbox_id)
    except HostError as exc:
        await deny(websocket, from_host_error(exc))
        return
    except ApiError as exc:
        await deny(websocket, exc)
        return
    prefix = f"{websocket.scope.get('root_path', '')}/v1/sandboxes/{sandbox_id}/ports/{number}"
    await forward_ws(websocket, service, sandbox_id, ns_ip, number, prefix, path,
                     drop=WS_REQUEST_DROP | {"cookie"},
                     headers_out=lambda hs: [(k, v) for k, v in hs
                                             if k not in (b"set-cookie", b"set-cookie2")])


async def forward_ws(websocket: WebSocket, service: SandboxService, sandbox_id: str,
                     ns_ip: str, number: int, prefix: str, path: str, *,
                     drop: frozenset[str] = WS_REQUEST_DROP,
                     headers_in: list[tuple[str, str]] | None = None,
                     headers_out: HeaderFilter | None = None) -> None:
    """The sandbox's server connected (within the connect timeout), the handshake accepted
    with the subprotocol it chose, and messages relayed until either side closes. When the
    sandbox's port does not complete a handshake, the client's is accepted and closed at
    once with 1014 (bad gateway) and the reason, which is what a browser can see."""
    settings: Settings = websocket.app.state.settings
    target = _upstream_target(websocket, prefix, path)
    if not target.isascii():
        await deny(websocket, ApiError(400, "bad_request",
                                       "cannot forward this request: non-ASCII path"))
        return
    host = f"[{ns_ip}]" if ":" in ns_ip else ns_ip
    uri = f"ws://{host}:{number}{target.decode('ascii')}"
    headers = headers_in if headers_in is not None else [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in forward_headers(websocket, prefix, drop)]
    where = f"WebSocket {sandbox_id}:{number}"
    async with service.busy(sandbox_id):
        try:
            upstream = await wsproxy.open_upstream(
                uri, headers, wsproxy.subprotocols_of(websocket),
                settings.port_connect_timeout_seconds)
        except Exception as exc:  # refused, timed out, not a WebSocket server, bad URI
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.info("%s: no WebSocket upstream: %s", where, detail)
            await wsproxy.refuse_after_accept(
                websocket, wsproxy.BAD_GATEWAY,
                f"port {number} of sandbox {sandbox_id} did not answer ({detail})")
            return
        try:
            accepted = wsproxy.response_headers(upstream, HOP_BY_HOP)
            await websocket.accept(subprotocol=upstream.subprotocol,
                                   headers=accepted if headers_out is None
                                   else headers_out(accepted))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await upstream.close(wsproxy.GOING_AWAY)
            raise
        await wsproxy.relay(websocket, upstream, where)


router.add_api_websocket_route(PROXY_PATH, proxy_port_ws, name="proxy_port_ws")
