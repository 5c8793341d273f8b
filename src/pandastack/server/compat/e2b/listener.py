"""E2B's ways into a sandbox on the sandbox-port listener (server/preview/listener.py hands over).

A request names a sandbox port by the headers `E2b-Sandbox-Id` + `E2b-Sandbox-Port` (the
SDKs' E2B_SANDBOX_URL mode: one URL for every sandbox) or by its host name
`{port}-{sandbox id}.{domain}` (E2B_DOMAIN mode). Port 49983 is the daemon (`envd/app.py`),
49999 the code interpreter (`interpreter.py`); both are answered here, by our guest agent's
operations. Any other port is our port proxy (server/preview/listener.py), where E2B's traffic
token is one more credential.

Credentials, each checked before the sandbox is looked up, so that a wrong one learns
nothing about which sandboxes exist: on 49983 `X-Access-Token` (the envd token); on the
others `E2B-Traffic-Access-Token` or `X-Access-Token` (traffic or envd token: the code
interpreter sends the envd token on /execute, the traffic token on /contexts); an API key
of the sandbox's team opens every port. A valid token of a sandbox that is gone, or a key
of another team, is 404 as our API says. The OS user is the Basic auth user name.

A sandbox E2B reads as paused (ours: paused, hibernated, stopped, host_lost) is 502 "... was
not found" (Connect's unavailable), as E2B's proxy answers, unless its lifecycle resumes on
traffic (autoPause): such a hibernated sandbox is woken by the call. One that has ended is
502 "... was not found" too, as E2B's proxy answers for a sandbox that is gone."""

from __future__ import annotations

import base64
import binascii
import logging
import math
import re

from fastapi import FastAPI
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from pandastack.rules import SANDBOX_ID_RE
from pandastack.server.accounts.auth import key_from_headers
from pandastack.server.routes.ports import as_request, key_team
from pandastack.server.sandboxes.lifecycle import wakes_on_traffic
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.store import Sandbox
from pandastack.server.web.errors import ApiError, not_found
from pandastack.wire.sandboxes import ENDED_STATES

from . import interpreter
from .envd import app as envd_app
from .envd import files
from .envd.connect import HTTP_STATUS, ConnectError, code_of_status
from .errors import E2bError, as_e2b, e2b_response
from .rest.states import STATES, past_timeout
from .target import ENVD_PORT, INTERPRETER_PORT, SCOPE_KEY, SandboxTarget
from .tokens import tokens_for

log = logging.getLogger("pandastack.server")

ID_HEADER = "e2b-sandbox-id"
PORT_HEADER = "e2b-sandbox-port"
ACCESS_HEADER = "x-access-token"
TRAFFIC_HEADER = "e2b-traffic-access-token"
# Never forwarded to a sandbox's own port: they are credentials (or routing) for us.
FORWARD_DROP = frozenset({ID_HEADER, PORT_HEADER, ACCESS_HEADER, TRAFFIC_HEADER})
E2B_PORTS = (ENVD_PORT, INTERPRETER_PORT)
# A Connect call's path: `/<package>.<Service>/<Method>`.
CONNECT_PATH = re.compile(r"^/[A-Za-z_][\w.]*\.[A-Za-z_]\w*/[A-Za-z_]\w*$")
MAX_USER = 64


def speaks_e2b(conn: HTTPConnection) -> bool:
    """Whether the caller is one of E2B's SDKs (its headers): its errors are E2B-shaped."""
    headers = conn.headers
    return any(name in headers for name in (ID_HEADER, PORT_HEADER, ACCESS_HEADER,
                                            TRAFFIC_HEADER))


def header_target(conn: HTTPConnection) -> tuple[int, str] | None:
    """(port, sandbox id) the E2B routing headers name; None without them; 400 for half a
    pair or a port that is not one."""
    sandbox_id = conn.headers.get(ID_HEADER)
    port = conn.headers.get(PORT_HEADER)
    if sandbox_id is None and port is None:
        return None
    if sandbox_id is None or port is None:
        raise E2bError(400, "E2b-Sandbox-Id and E2b-Sandbox-Port go together")
    port = port.strip()
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise E2bError(400, "E2b-Sandbox-Port must be a port number (1..65535)")
    return int(port), sandbox_id.strip()


def resolve_target(conn: HTTPConnection, by_host: tuple[int, str] | None
                   ) -> tuple[int, str] | None:
    """The sandbox port a request names, by headers or host name (None: neither). Both
    naming different ports is refused: a page served on one sandbox port could otherwise
    send its own origin's requests elsewhere."""
    by_headers = header_target(conn)
    if by_headers is not None and by_host is not None and by_headers != by_host:
        raise E2bError(400, "the E2b-Sandbox-Id / E2b-Sandbox-Port headers name another "
                       "sandbox port than the host name")
    return by_headers or by_host


def basic_user(conn: HTTPConnection) -> str | None:
    """The OS user an SDK names: `Authorization: Basic base64("user:")` (None: none named)."""
    auth = conn.headers.get("authorization")
    if not auth:
        return None
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise E2bError(400, "Authorization: Basic needs base64 of 'user:'") from None
    user = decoded.partition(":")[0]
    if not user:
        return None
    if len(user) > MAX_USER or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?", user):
        raise E2bError(400, f"not a user name: {user[:MAX_USER]!r}")
    return user


def _live_row(service: SandboxService, sandbox_id: str, team: str | None = None) -> Sandbox:
    """The sandbox's row (404 if none, or if `team` is given and it is another's); 502 for
    one that has ended."""
    row = service.store.sandbox_by_id(sandbox_id) if SANDBOX_ID_RE.match(sandbox_id) else None
    if row is None or (team is not None and row.team != team):
        raise not_found(f"sandbox {sandbox_id!r}")
    if row.state in ENDED_STATES or past_timeout(row):
        # What E2B's proxy answers for a sandbox that is gone: the SDKs read "was not found"
        # under a 502 as "killed or reached its timeout" (their health probe included),
        # where our 409 would leave them unsure whether it runs.
        why = row.state if row.state in ENDED_STATES else "its timeout elapsed"
        raise E2bError(502, f"sandbox {sandbox_id} was not found: it has ended ({why})")
    return row


def refuse_paused(row: Sandbox) -> None:
    """A sandbox E2B reads as paused answers as E2B's proxy does, 502 "was not found" (the
    SDK's `is_running()` is then False, as after E2B's own pause), unless its lifecycle
    resumes on traffic (E2B's autoResume: `lifecycle.wakes_on_traffic`): such a hibernated
    sandbox is woken by the call. `connect` resumes any of them."""
    if STATES.get(row.state) != "paused":
        return
    if row.state == "hibernated" and wakes_on_traffic(row.on_expiry):
        return
    raise E2bError(502, f"sandbox {row.id} was not found: it is paused ({row.state}); "
                   "connect resumes it")


def _token_rate(conn: HTTPConnection, sandbox_id: str) -> None:
    wait = conn.app.state.rate_limiter.take(f"e2b:{sandbox_id}")
    if wait > 0:
        raise ApiError(429, "rate_limited", "too many requests for this sandbox",
                       {"Retry-After": str(max(1, math.ceil(wait)))})


def token_team(conn: HTTPConnection, service: SandboxService, sandbox_id: str,
               port: int) -> str | None:
    """The team of the sandbox an E2B token for `port` opens; None when the request carries
    no token for it; 401 for a wrong one (checked before any lookup), 404 for no sandbox."""
    row = _token_row(conn, service, sandbox_id, port)
    return None if row is None else row.team


def _token_row(conn: HTTPConnection, service: SandboxService, sandbox_id: str,
               port: int) -> Sandbox | None:
    tokens = tokens_for(service.store)
    if port == ENVD_PORT:
        given = conn.headers.get(ACCESS_HEADER)
        if given is None:
            # A signed /files URL (the SDK's download_url / upload_url) opens the file it
            # names without a token: its signature is made from the sandbox's envd token.
            if not files.signed_request(conn, sandbox_id, service.store):
                return None
            _token_rate(conn, sandbox_id)
            return _live_row(service, sandbox_id)
        if not tokens.opens_envd(sandbox_id, given.strip()):
            raise E2bError(401, "invalid X-Access-Token for this sandbox")
    else:
        candidates = [conn.headers.get(h) for h in (TRAFFIC_HEADER, ACCESS_HEADER)]
        given_all = [c.strip() for c in candidates if c is not None]
        if not given_all:
            return None
        if not any(tokens.opens_traffic(sandbox_id, g) for g in given_all):
            raise E2bError(401, "invalid E2B-Traffic-Access-Token for this sandbox port")
    _token_rate(conn, sandbox_id)
    return _live_row(service, sandbox_id)


async def caller_row(conn: HTTPConnection, service: SandboxService, sandbox_id: str,
                     port: int) -> Sandbox:
    """The sandbox an E2B request acts on, and so its team: by token, else by an API key of
    the sandbox's team (404 for another team's), else 401."""
    row = _token_row(conn, service, sandbox_id, port)
    if row is not None:
        return row
    if key_from_headers(as_request(conn)) is not None:
        return _live_row(service, sandbox_id, await key_team(conn))
    header = "X-Access-Token" if port == ENVD_PORT else "E2B-Traffic-Access-Token"
    raise E2bError(401, f"this sandbox port needs {header} (or an API key)")


def error_for(conn: HTTPConnection, port: int, exc: BaseException) -> Response | None:
    """`exc` as the answer the caller's protocol expects: Connect's `{code, message}` on a
    daemon's Connect path, E2B's `{code: status, message}` otherwise; None: not ours."""
    if isinstance(exc, ConnectError):
        return JSONResponse(exc.body(), status_code=HTTP_STATUS[exc.code])
    error = as_e2b(exc)
    if error is None:
        return None
    headers = getattr(exc, "headers", None) or None
    if port == ENVD_PORT and CONNECT_PATH.match(conn.url.path):
        code = "failed_precondition" if error.status == 409 else code_of_status(error.status)
        return JSONResponse({"code": code, "message": error.message},
                            status_code=error.status, headers=headers)
    return e2b_response(error.status, error.message, headers)


class E2bListener:
    """Answers ports 49983 and 49999 of a sandbox; preview/listener.py calls it for those."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.envd: ASGIApp = envd_app.build()
        self.interpreter: ASGIApp = envd_app.room_app(list(interpreter.ROUTES))

    async def __call__(self, scope: Scope, receive: Receive, send: Send, port: int,
                       sandbox_id: str) -> None:
        conn = HTTPConnection(scope)
        service: SandboxService = self.app.state.service
        try:
            seen = await caller_row(conn, service, sandbox_id, port)
            team = seen.team
            user = basic_user(conn)
            refuse_paused(seen)
            row, _ = await service.running(team, sandbox_id)  # wakes an autoResume one
        except Exception as exc:
            response = error_for(conn, port, exc)
            if response is None:
                log.exception("unhandled error resolving E2B sandbox port %s of %s", port,
                              sandbox_id)
                response = e2b_response(500, "internal error")
            await self._refuse(scope, receive, send, response)
            return
        target = SandboxTarget(service=service, team=team, sandbox_id=row.id, port=port,
                               user=user)
        inner = self.envd if port == ENVD_PORT else self.interpreter
        # For as long as a call (a command's stream, say) runs, the idle reaper waits.
        async with service.busy(row.id):
            await inner({**scope, SCOPE_KEY: target}, receive, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, response: Response) -> None:
        if scope["type"] == "websocket":
            websocket = WebSocket(scope, receive, send)
            if "websocket.http.response" in scope.get("extensions", {}):
                await websocket.send_denial_response(response)
            else:
                await websocket.close(1008)
            return
        await response(scope, receive, send)
