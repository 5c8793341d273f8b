"""How the host API answers a failed request: the error envelope of `hostport.host_api.codec`
with the status of its class. The routes raise the port's own errors; nothing here
translates them."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from pandastack.hostport.errors import HostError
from pandastack.hostport.host_api.codec import (
    ErrorBody,
    ErrorEnvelope,
    dump_json,
    encode_error,
    status_of,
)

from .auth import Unauthorized


class WireJSONResponse(JSONResponse):
    """Every JSON answer of the host API, written by `hostport.host_api.codec.dump_json`
    (guest strings with undecodable bytes cross unchanged; Starlette's UTF-8 encoding would
    refuse them)."""

    def render(self, content: Any) -> bytes:
        return dump_json(content)


def error_response(exc: BaseException) -> JSONResponse:
    return WireJSONResponse(encode_error(exc).model_dump(mode="json"),
                            status_code=status_of(exc))


def _plain(status: int, type_: str, message: str) -> JSONResponse:
    body = ErrorEnvelope(error=ErrorBody(type=type_, message=message))
    return WireJSONResponse(body.model_dump(mode="json"), status_code=status)


def install_handlers(app: FastAPI) -> None:
    async def host_error(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                 for e in exc.errors()[:5]]
        return _plain(422, "ValueError", "invalid request: " + "; ".join(parts))

    async def unauthorized(_request: Request, exc: Exception) -> JSONResponse:
        return _plain(401, "Unauthorized", str(exc))

    async def http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return _plain(exc.status_code, "HTTPError", str(exc.detail))

    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it after this answer, for the server to log with its traceback.
        return error_response(exc)

    app.add_exception_handler(HostError, host_error)
    app.add_exception_handler(ValueError, host_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Unauthorized, unauthorized)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
