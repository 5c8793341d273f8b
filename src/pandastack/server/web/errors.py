"""The one error envelope, `{"error": {code, message, request_id}}`, and everything that maps
exceptions onto it: API errors, validation errors, unknown routes, what a host call raised
(`api_error_of`, the one translation every route, stream and the service use) and unexpected
exceptions (the last as a 500 from the request-id middleware)."""

from __future__ import annotations

import errno
import logging
import secrets
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pandastack.hostport.errors import (
    AgentConnectionError,
    AgentError,
    AgentLimitError,
    CodeContextNotFound,
    CodeInterpreterUnavailable,
    GuestIncompatible,
    GuestOSError,
    HostError,
    HostExhausted,
    HostLost,
    HostUnavailable,
    ImageError,
    ImageNotFound,
    ImageTooLarge,
    NoObjectStore,
    ObjectStoreUnavailable,
    RegistryAuthError,
    RegistryUnavailable,
    SandboxNotFound,
    SandboxStateError,
    SetupError,
    SnapshotFailed,
    SnapshotNotFound,
    UnsupportedLanguage,
    VMExited,
    VolumeInUse,
    VolumeNotFound,
)
from pandastack.rules import STATUS_ERROR_CODE, ErrorCode
from pandastack.wire.sandboxes import ErrorBody, ErrorEnvelope

from .telemetry import note_error, note_host_unavailable

log = logging.getLogger("pandastack.server")

REQUEST_ID_HEADER = "X-Request-Id"

#: The code of an HTTP error raised without one (Starlette's, FastAPI's): the shared table,
#: plus statuses no code of ours stands for.
STATUS_CODES: dict[int, ErrorCode] = {**STATUS_ERROR_CODE, 405: "bad_request",
                                      415: "bad_request"}

# errno name inside the guest -> (HTTP status, code)
GUEST_ERRNO: dict[str, tuple[int, ErrorCode]] = {
    "ENOENT": (404, "not_found"), "ESRCH": (404, "not_found"),
    "EEXIST": (409, "conflict"), "ENOTEMPTY": (409, "conflict"), "EBUSY": (409, "conflict"),
    "EACCES": (403, "forbidden"), "EPERM": (403, "forbidden"), "EROFS": (403, "forbidden"),
    "ENOSPC": (507, "insufficient_storage"), "EDQUOT": (507, "insufficient_storage"),
    "EFBIG": (413, "payload_too_large"),
    # A fork or thread failed at the sandbox's process cap (or memory for one): retry later.
    "EAGAIN": (429, "rate_limited"),
    "EISDIR": (400, "bad_request"), "ENOTDIR": (400, "bad_request"),
    "EINVAL": (400, "bad_request"), "ENAMETOOLONG": (400, "bad_request"),
    "ELOOP": (400, "bad_request"), "EXDEV": (400, "bad_request"),
}


class ApiError(Exception):
    """Raised anywhere in a request; rendered as the envelope with `status`."""

    def __init__(self, status: int, code: ErrorCode, message: str,
                 headers: dict[str, str] | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code: ErrorCode = code
        self.message = message
        self.headers = headers or {}
        # More fields of the envelope's error body (`ErrorBody`: a quota's limit, value, use).
        self.details = details or {}


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


def bad_request(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


def conflict(message: str) -> ApiError:
    return ApiError(409, "conflict", message)


def from_host_error(exc: HostError) -> ApiError:
    """Map a host runtime error onto an API error (never a 500 for a guest-side failure)."""
    if isinstance(exc, GuestOSError):
        status, code = GUEST_ERRNO.get(exc.errno_name, (400, "bad_request"))
        message = f"{exc.errno_name}: {exc.message}" + (f" ({exc.path})" if exc.path else "")
        return ApiError(status, code, message)
    if isinstance(exc, HostExhausted):
        return ApiError(503, "unavailable", f"{exc} (no host has room for it now; retry later "
                        "or ask for a smaller sandbox)", headers={"Retry-After": "5"})
    if isinstance(exc, NoObjectStore):
        return ApiError(409, "conflict", f"{exc} (set PANDASTACK_OBJECT_STORE on the hosts)")
    if isinstance(exc, ObjectStoreUnavailable):
        return ApiError(503, "unavailable", f"{exc} (nothing stored is lost: retry once the "
                        "object store is back)", headers={"Retry-After": "5"})
    if isinstance(exc, HostLost):
        return ApiError(409, "host_lost", f"{exc}: the sandbox's VM is gone with its host "
                        "(wake it to restore the state it last saved, if it saved one)")
    if isinstance(exc, HostUnavailable):
        note_host_unavailable()
        return ApiError(503, "host_unavailable", f"{exc} (the sandbox is not lost: retry once "
                        "its host is back)", headers={"Retry-After": "5"})
    if isinstance(exc, SandboxNotFound):
        return ApiError(409, "conflict", f"sandbox {exc} is not running on this host")
    if isinstance(exc, SandboxStateError):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, SnapshotNotFound):
        return ApiError(404, "not_found", f"snapshot {exc} not found")
    if isinstance(exc, VolumeNotFound):
        return ApiError(404, "not_found", f"volume {exc} not found")
    if isinstance(exc, VolumeInUse):
        return ApiError(409, "volume_in_use", str(exc))
    if isinstance(exc, SnapshotFailed):
        if exc.no_space:
            return ApiError(507, "insufficient_storage",
                            f"{exc} (no space left for the snapshot; the sandbox keeps running)")
        return ApiError(503, "unavailable", f"{exc} (the sandbox keeps running)")
    if isinstance(exc, CodeContextNotFound):
        return ApiError(404, "not_found", f"code context {exc} not found")
    if isinstance(exc, CodeInterpreterUnavailable):
        return ApiError(409, "conflict", f"{exc} (create the sandbox from a template with a "
                        "code interpreter, e.g. code-interpreter)")
    if isinstance(exc, UnsupportedLanguage):
        return ApiError(422, "validation_error", str(exc))
    if isinstance(exc, AgentLimitError):  # the answer is bigger than the host takes
        return ApiError(413, "payload_too_large", str(exc))
    if isinstance(exc, VMExited):  # not worth a retry: the sandbox ends (or stops) shortly
        return ApiError(409, "conflict", f"{exc}: the VM died; the sandbox is being ended "
                        "(a persistent one is stopped, and wake starts it again)")
    if isinstance(exc, GuestIncompatible):  # a retry gets the same answer
        return ApiError(409, "conflict", f"sandbox agent incompatible: {exc}")
    if isinstance(exc, AgentConnectionError):
        return ApiError(503, "unavailable", f"sandbox agent unavailable: {exc}")
    if isinstance(exc, AgentError):
        return ApiError(503, "unavailable", f"sandbox agent error: {exc}")
    if isinstance(exc, ImageError):  # the message names the image (ADR 0046)
        return _image_error(exc)
    if isinstance(exc, SetupError):
        return ApiError(503, "unavailable", f"host setup failed: {exc}")
    return ApiError(503, "unavailable", f"host runtime error: {exc}")


def _image_error(exc: ImageError) -> ApiError:
    if isinstance(exc, ImageNotFound):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, RegistryAuthError):
        return ApiError(403, "forbidden", str(exc))
    if isinstance(exc, ImageTooLarge):
        return ApiError(413, "payload_too_large", str(exc))
    if isinstance(exc, RegistryUnavailable):  # the image's registry, not ours, failed
        return ApiError(502, "bad_gateway", str(exc))
    return ApiError(422, "validation_error", str(exc))


def api_error_of(exc: BaseException) -> ApiError | None:
    """What a failed host call tells the client, or None for an exception that is a bug of
    ours (then: logged, 500). A ValueError is an argument the host refused (422); an OSError
    is the control plane's or the host's own disk or socket, not the guest's."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, HostError):
        return from_host_error(exc)
    if isinstance(exc, ValueError):
        return ApiError(422, "validation_error", str(exc))
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return ApiError(507, "insufficient_storage", f"host: {exc}")
        return ApiError(503, "unavailable", f"host: {exc}")
    return None


T = TypeVar("T")


async def host_call(op: Awaitable[T]) -> T:
    """Await a host operation; what it raises becomes its API error (`api_error_of`), and
    what is a bug of ours stays itself (a 500)."""
    try:
        return await op
    except Exception as exc:
        api = api_error_of(exc)
        if api is None:
            raise
        raise api from None


def clean_text(text: str) -> str:
    """`text` as valid Unicode: strings from the guest (file names, command lines, messages)
    carry each byte that is not UTF-8 as a surrogate escape, which a JSON response cannot
    encode; each becomes U+FFFD, as a lenient UTF-8 decoder would show it."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def request_id_of(scope_or_request: Request | Scope) -> str:
    scope = (scope_or_request.scope if isinstance(scope_or_request, Request)
             else scope_or_request)
    state = scope.setdefault("state", {})
    rid = state.get("request_id")
    if not isinstance(rid, str):
        rid = new_request_id()
        state["request_id"] = rid
    return rid


def envelope(code: ErrorCode, message: str, request_id: str,
             details: dict[str, Any] | None = None) -> dict[str, Any]:
    body = ErrorEnvelope(error=ErrorBody(code=code, message=clean_text(message),
                                         request_id=request_id, **(details or {})))
    return body.model_dump(exclude_none=True)


def error_response(request: Request, status: int, code: ErrorCode, message: str,
                   headers: dict[str, str] | None = None,
                   details: dict[str, Any] | None = None) -> JSONResponse:
    rid = request_id_of(request)
    note_error(request.app, status, code)
    return JSONResponse(envelope(code, message, rid, details), status_code=status,
                        headers={**(headers or {}), REQUEST_ID_HEADER: rid})


def _validation_message(exc: RequestValidationError) -> tuple[int, ErrorCode, str]:
    errors = cast(list[dict[str, Any]], exc.errors())
    parts = []
    for err in errors[:5]:
        if err.get("type") == "json_invalid":
            return 400, "bad_request", "request body is not valid JSON"
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return 422, "validation_error", "; ".join(parts) + more


def install_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(request, exc.status, exc.code, exc.message, exc.headers,
                              exc.details)

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        status, code, message = _validation_message(exc)
        return error_response(request, status, code, message)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = STATUS_CODES.get(exc.status_code, "bad_request" if exc.status_code < 500
                                else "internal")
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        if exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        return error_response(request, exc.status_code, code, message,
                              dict(exc.headers or {}))

    async def host_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HostError)
        api = from_host_error(exc)
        return error_response(request, api.status, api.code, api.message, api.headers)

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        # The database went away (restart, network, failover): nothing is lost, and the
        # request can be sent again as it is once the database answers.
        log.warning("database out of reach in %s %s: %s", request.method, request.url.path,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return error_response(request, 503, "unavailable", "the database is out of reach "
                              "for now (nothing is lost: retry shortly)", {"Retry-After": "2"})

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(OperationalError, database_error)
    app.add_exception_handler(InterfaceError, database_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(HostError, host_error)


class RequestIdMiddleware:
    """Gives every request an id, echoes it as `X-Request-Id`, and turns any exception that
    escaped the handlers into a 500 envelope (if the response has not started yet)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s (request %s)", scope.get("method"),
                          scope.get("path"), rid)
            if started:
                raise
            note_error(scope.get("app"), 500, "internal")
            body = ErrorEnvelope(error=ErrorBody(code="internal", message="internal error",
                                                 request_id=rid)).model_dump_json().encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"x-request-id", rid.encode())]})
            await send({"type": "http.response.body", "body": body})
