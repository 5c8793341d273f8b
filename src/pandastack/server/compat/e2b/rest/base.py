"""What every E2B REST route shares: errors in E2B's shape (the app's /v1 envelope handlers
never see them), the caller's key (ours, or its `e2b_` alias), and the service."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, cast

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pandastack.hostport.errors import HostError
from pandastack.server.accounts.auth import Principal, key_from_headers, principal
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.settings import Settings
from pandastack.server.web.errors import ApiError, from_host_error
from pandastack.server.web.jsonbody import StrictJsonRoute
from pandastack.server.web.telemetry import note_error

from ..errors import E2bError, e2b_response
from ..tokens import SandboxTokens, tokens_for
from .translate import domain_of

log = logging.getLogger("pandastack.server.e2b")

# E2B's SDKs before 2.46 refuse a key that is not `e2b_` + hex before sending it (their
# `validate_api_key`, on unless E2B_VALIDATE_API_KEY=false). A pandastack key's alias in
# that form is the key's own bytes in hex: nothing stored, and it opens exactly what the key
# opens (same hash lookup, team, rate limit and revocation).
E2B_KEY_PREFIX = "e2b_"


def e2b_key(key: str) -> str:
    """The `e2b_<hex>` alias of a pandastack key."""
    return E2B_KEY_PREFIX + key.encode("utf-8").hex()


def our_key(key: str) -> str:
    """The pandastack key an `e2b_` alias stands for; any other key as it is."""
    if not key.startswith(E2B_KEY_PREFIX):
        return key
    try:
        return bytes.fromhex(key[len(E2B_KEY_PREFIX):]).decode("ascii")
    except ValueError:
        return key  # not an alias of ours: refused as any unknown key is


async def e2b_principal(request: Request) -> Principal:
    key = key_from_headers(request)
    ours = our_key(key) if key else key
    if ours != key and ours is not None:
        headers = [(k, v) for k, v in request.scope["headers"]
                   if k not in (b"authorization", b"x-api-key")]
        request = Request({**request.scope, "headers": [*headers, (b"x-api-key",
                                                                   ours.encode())]})
    return await principal(request)


# async: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request.
async def get_service(request: Request) -> SandboxService:
    return cast(SandboxService, request.app.state.service)


async def get_settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


Caller = Annotated[Principal, Depends(e2b_principal)]
Service = Annotated[SandboxService, Depends(get_service)]
AppSettings = Annotated[Settings, Depends(get_settings)]


def tokens(service: SandboxService) -> SandboxTokens:
    return tokens_for(service.store)


def domain(settings: Settings) -> str:
    return domain_of(settings.preview_base)


def _validation_message(exc: RequestValidationError) -> str:
    errors = cast(list[dict[str, Any]], exc.errors())
    parts = []
    for err in errors[:5]:
        if err.get("type") == "json_invalid":
            return "request body is not valid JSON"
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def error_response(request: Request, exc: Exception) -> Response | None:
    """E2B's `{"code", "message"}` for what a route raised; None: a bug of ours (a 500).
    Our 422 is E2B's 400 (its SDKs read 400 as bad input)."""
    headers: dict[str, str] = {}
    if isinstance(exc, E2bError):
        status, message = exc.status, exc.message
    elif isinstance(exc, ApiError | HostError):
        api = exc if isinstance(exc, ApiError) else from_host_error(exc)
        status, message, headers = api.status, api.message, dict(api.headers)
    elif isinstance(exc, RequestValidationError):
        status, message = 400, _validation_message(exc)
    elif isinstance(exc, StarletteHTTPException):
        status = exc.status_code
        message = exc.detail if isinstance(exc.detail, str) else "bad request"
        headers = dict(exc.headers or {})
    elif isinstance(exc, OperationalError | InterfaceError):
        log.warning("database out of reach in %s %s", request.method, request.url.path)
        status, message = 503, "the database is out of reach for now (retry shortly)"
        headers = {"Retry-After": "2"}
    else:
        return None
    if status == 422:
        status = 400
    note_error(request.app, status, "e2b")
    return e2b_response(status, message, headers or None)


class E2bRoute(StrictJsonRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def e2b_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = error_response(request, exc)
                if response is None:
                    raise
                return response

        return e2b_handler
