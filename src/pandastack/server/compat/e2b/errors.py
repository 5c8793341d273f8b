"""E2B's error shapes. The REST API and the daemon's plain HTTP routes answer
`{"code": <http status>, "message": str}`; Connect RPC answers `{"code": "<connect code>",
"message": str}` (envd/connect.py). Never a traceback, never a 500 for bad input."""

from __future__ import annotations

from starlette.responses import JSONResponse

from pandastack.hostport.errors import HostError
from pandastack.server.web.errors import ApiError, from_host_error


class E2bError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def e2b_response(status: int, message: str, headers: dict[str, str] | None = None
                 ) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status,
                        headers=headers)


def as_e2b(exc: BaseException) -> E2bError | None:
    """Our own errors in E2B's shape (same status and message); None for anything else."""
    if isinstance(exc, E2bError):
        return exc
    if isinstance(exc, ApiError):
        return E2bError(exc.status, exc.message)
    if isinstance(exc, HostError):
        api = from_host_error(exc)
        return E2bError(api.status, api.message)
    return None
