"""The daemon's app (port 49983): the Connect services `process.Process` and
`filesystem.Filesystem` at `/<package>.<Service>/<Method>`, and the plain HTTP routes
(`/files`, `/health`, ...). The listener (compat/e2b/listener.py) has put the resolved
sandbox into the scope before anything here runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pandastack.hostport.errors import HostError
from pandastack.server.web.errors import ApiError

from ..errors import E2bError, as_e2b, e2b_response
from . import files, filesystem, process
from .connect import ConnectError, Method, code_of_status, serve, unary_error

log = logging.getLogger("pandastack.server")

SERVICES: dict[str, dict[str, Method]] = {
    "process.Process": process.METHODS,
    "filesystem.Filesystem": filesystem.METHODS,
}


def translate(exc: BaseException) -> ConnectError | None:
    """The service layer's errors in Connect's terms (None: a bug of ours)."""
    error = as_e2b(exc)
    if error is None:
        return None
    return ConnectError(code_of_status(error.status), error.message)


async def rpc(request: Request) -> Response:
    service, name = request.path_params["service"], request.path_params["method"]
    if "." not in service:  # not a Connect path: a plain route that is not there
        raise HTTPException(404, f"no route {request.url.path}")
    method = SERVICES.get(service, {}).get(name)
    if method is None:
        # connect-go's answer to an unknown procedure: 404, read by clients as unimplemented
        return JSONResponse({"code": "unimplemented",
                             "message": f"no method /{service}/{name}"}, status_code=404)
    if request.method != "POST":
        return JSONResponse({"code": "unimplemented",
                             "message": "Connect calls are POSTs"}, status_code=405,
                            headers={"Allow": "POST"})
    try:
        return await serve(request, method, translate)
    except ConnectError as exc:
        return unary_error(exc)
    except Exception:
        log.exception("unhandled error in E2B's %s/%s", service, name)
        return unary_error(ConnectError("internal", "internal error"))


def _e2b_error(request: Request, exc: Exception) -> Response:
    error = as_e2b(exc)
    assert error is not None
    return e2b_response(error.status, error.message, getattr(exc, "headers", None) or None)


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return e2b_response(exc.status_code, exc.detail or "error",
                        dict(exc.headers) if exc.headers else None)


def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error in the E2B room: %s %s", request.method, request.url.path,
              exc_info=exc)
    return e2b_response(500, "internal error")


def room_app(routes: Sequence[BaseRoute]) -> Starlette:
    """A Starlette app of the room's routes whose every error is E2B-shaped."""
    return Starlette(routes=list(routes), exception_handlers={
        E2bError: _e2b_error, ApiError: _e2b_error, HostError: _e2b_error,
        HTTPException: _http_error, Exception: _internal_error})


def build() -> Starlette:
    return room_app([*files.ROUTES,
                     Route("/{service}/{method}", rpc,
                           methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"])])
