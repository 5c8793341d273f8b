"""Every exception the SDK raises. Catch `PandastackError` to catch them all.

The eight names to catch are the issue's: `AuthError`, `NotFoundError`, `InvalidRequestError`,
`RateLimitError`, `SandboxError`, `TimeoutError`, `APIConnectionError`, `ServerError`. What is
raised is a leaf of this tree (or `APIError` itself, for a status nobody expects, like 418); the
older names are those leaves, or aliases::

    PandastackError                   .status / .code / .request_id: None unless the server said
    ├── ConfigError                   no API URL / key configured, or an unreadable config file
    ├── ProtocolError                 the reply is not in the shape the wire types promise
    ├── APIConnectionError            no HTTP answer: cannot connect, connection dropped
    │   └── TransportTimeoutError     connect/read/write/pool timeout  (also a TimeoutError, below)
    ├── TimeoutError                  any timeout; also a builtin TimeoutError
    │   ├── TransportTimeoutError     the client gave up (no status, no request id)
    │   └── WaitTimeoutError          408: the server stopped waiting (also an APIError)
    ├── TemplateBuildError            a template build ended failed (`build`: its status)
    └── APIError                      the server answered with an error envelope: status, code, ...
        ├── AuthError                 401/403
        │   ├── AuthenticationError   401: no key, unknown or revoked key
        │   └── PermissionDeniedError 403: the key may not do this, or the guest said EACCES/EPERM
        ├── NotFoundError             404
        ├── InvalidRequestError       400, 422 (also raised locally before sending; no request_id)
        │   └── PayloadTooLargeError  413
        ├── RateLimitError            429 (`retry_after` seconds, when the server said)
        │   └── QuotaExceededError    429 `quota_exceeded`: at a team quota (`limit`, `value`, ...)
        ├── SandboxError              the sandbox cannot do it
        │   ├── ConflictError         409: not running / ended, or the guest said EEXIST/EBUSY...
        │   │   ├── TemplateBuildingError  409: the template is still building (`retry_after`)
        │   │   ├── HostLostError     409: the sandbox's host was lost (wake restores saved state)
        │   │   └── VolumeInUseError  409: the volume is attached (a second writer, a delete...)
        │   └── InsufficientStorageError  507: the guest's disk is full (ENOSPC/EDQUOT)
        ├── ServerError               any other 5xx: internal error, unavailable, gateway timeout
        │   └── HostUnavailableError  503: the sandbox's host is out of reach for now (not lost)
        └── WaitTimeoutError          408 (see TimeoutError)

Aliases (the same class objects): `ValidationError` is `InvalidRequestError`, `TransportError`
is `APIConnectionError`.

`TransportTimeoutError` and `WaitTimeoutError` each have two parents, so that both ``except
TimeoutError`` (every timeout) and the older ``except TransportError`` / ``except APIError``
keep catching them. Note that a command that runs longer than its `timeout_seconds` is not an
exception: it comes back as an `ExecResult` with `timed_out=True`.

Every error has `status` (the HTTP status), `code` and `request_id` attributes; they are None
where there was no HTTP answer. Quote `request_id` when reporting a problem: it finds the
server's log lines for that request.

This module defines a class named `TimeoutError`, which shadows the builtin inside this module:
here the builtin is always spelled `builtins.TimeoutError`.
"""

from __future__ import annotations

import builtins

from pandastack.rules import ERROR_STATUS, STATUS_ERROR_CODE, ErrorCode

__all__ = [
    "APIConnectionError",
    "APIError",
    "AuthError",
    "AuthenticationError",
    "ConfigError",
    "ConflictError",
    "InsufficientStorageError",
    "InvalidRequestError",
    "NotFoundError",
    "PandastackError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "QuotaExceededError",
    "RateLimitError",
    "SandboxError",
    "ServerError",
    "TemplateBuildError",
    "TemplateBuildingError",
    "TimeoutError",
    "TransportError",
    "TransportTimeoutError",
    "ValidationError",
    "VolumeInUseError",
    "WaitTimeoutError",
]


class PandastackError(Exception):
    """Base class of every error raised by the pandastack SDK.

    Attributes (None unless the server answered with an error):
        status: the HTTP status code.
        code: the machine-readable error code of the envelope, e.g. ``"not_found"``.
        request_id: the server's id of the request.
    """

    status: int | None = None
    code: str | None = None
    request_id: str | None = None


class ConfigError(PandastackError):
    """The SDK does not know which server to talk to or which key to use."""


class ProtocolError(PandastackError):
    """The server replied, but the reply does not match the wire types (or a stream broke off)."""


class APIConnectionError(PandastackError):
    """The request did not get an HTTP response (DNS, connect refused, reset, broken stream...).

    The httpx exception is chained as `__cause__`.
    """


class TimeoutError(PandastackError, builtins.TimeoutError):
    """Something timed out: the HTTP client (`TransportTimeoutError`) or a server-side wait
    (`WaitTimeoutError`, 408). Also a builtin `TimeoutError`, so ``except TimeoutError`` works
    with either spelling. Never raised itself, only through those two."""


class APIError(PandastackError):
    """The server answered with an error.

    Attributes:
        status: HTTP status code (for an error reported inside an event stream, the status the
            code stands for, e.g. 404 for ``not_found``).
        code: the machine-readable error code, e.g. ``"not_found"``.
        message: the human-readable message.
        request_id: the server's id of the request (``None`` if the request was never sent or
            the reply had none).
    """

    status: int
    code: str

    def __init__(self, message: str, *, status: int, code: str,
                 request_id: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        rid = f", request_id={self.request_id}" if self.request_id else ""
        return f"{self.message} (status={self.status}, code={self.code}{rid})"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(message={self.message!r}, status={self.status}, "
                f"code={self.code!r}, request_id={self.request_id!r})")


# -- the transport side -------------------------------------------------------------------

class TransportTimeoutError(TimeoutError, APIConnectionError):
    """A connect, read, write or pool timeout of the HTTP client.

    For `exec` the read timeout is always longer than the command's own `timeout_seconds`, so this
    means the server or the network went silent, not that the command ran too long (a command that
    runs too long comes back as an `ExecResult` with `timed_out=True`).
    """

    def __str__(self) -> str:  # not OSError's
        return str(self.args[0]) if self.args else ""


# -- the server said no -------------------------------------------------------------------

class AuthError(APIError):
    """The key is missing, unknown or revoked (401, `AuthenticationError`), or it may not do
    this (403, `PermissionDeniedError`)."""


class AuthenticationError(AuthError):
    """The API key is missing, unknown or revoked (401)."""


class PermissionDeniedError(AuthError):
    """Not allowed (403): the key lacks the right (e.g. key management needs an admin key), or
    the guest refused the file operation (EACCES, EPERM, EROFS)."""


class NotFoundError(APIError):
    """No such sandbox, process, file or key (404). Another team's sandbox is also a 404."""


class InvalidRequestError(APIError):
    """The request was malformed or out of range (400/422, or rejected locally before sending,
    with `request_id` None), or too large (413, `PayloadTooLargeError`)."""


class PayloadTooLargeError(InvalidRequestError):
    """The request body is larger than the server accepts (413)."""


class RateLimitError(APIError):
    """Too many requests (429). `retry_after` is the server's hint in seconds, if it gave one."""

    def __init__(self, message: str, *, status: int, code: str,
                 request_id: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status=status, code=code, request_id=request_id)
        self.retry_after = retry_after


class QuotaExceededError(RateLimitError):
    """The team is at one of its quotas (429 `quota_exceeded`): waiting does not help, ending
    something or a higher quota does. `limit` names it (e.g. ``"max_sandboxes"``,
    ``"monthly_budget_usd"``), `value` is its value and `current` the team's use now."""

    def __init__(self, message: str, *, status: int, code: str,
                 request_id: str | None = None, retry_after: float | None = None,
                 limit: str | None = None, value: float | None = None,
                 current: float | None = None) -> None:
        super().__init__(message, status=status, code=code, request_id=request_id,
                         retry_after=retry_after)
        self.limit = limit
        self.value = value
        self.current = current


class SandboxError(APIError):
    """The sandbox cannot do what was asked: it is not running or has ended (409,
    `ConflictError`), the guest refused because of its state (409: EEXIST, ENOTEMPTY, EBUSY), or
    its disk is full (507, `InsufficientStorageError`)."""


class ConflictError(SandboxError):
    """The request conflicts with the current state, e.g. the sandbox is not running (409)."""


class TemplateBuildingError(ConflictError):
    """The template the create names is still being built (409, code ``template_building``);
    `retry_after` says when to ask again. `Sandbox.create` waits for the build by itself."""

    def __init__(self, message: str, *, status: int, code: str,
                 request_id: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status=status, code=code, request_id=request_id)
        self.retry_after = retry_after


class InsufficientStorageError(SandboxError):
    """The sandbox's disk is full (507: the guest said ENOSPC or EDQUOT)."""


class ServerError(APIError):
    """The server failed (5xx other than 507): internal error, unavailable, gateway timeout."""


class HostLostError(ConflictError):
    """The host the sandbox ran on stopped heartbeating and was given up (409 `host_lost`):
    its VM is gone. `wake()` restores the state it last saved (a hibernation or a snapshot),
    on another host; a sandbox that saved none can only be killed."""


class VolumeInUseError(ConflictError):
    """The volume is attached to a sandbox that has not ended (409 `volume_in_use`): a
    second read-write mount, a read-only one while a sandbox writes it, or a delete or
    resize while it is attached. Kill the sandbox that has it (hibernation keeps it)."""


class HostUnavailableError(ServerError):
    """The host the sandbox runs on cannot be reached right now (503 `host_unavailable`): its
    agent is down or restarting. The sandbox is not lost; retry once the host is back."""


class WaitTimeoutError(TimeoutError, APIError):
    """The server stopped waiting (408), e.g. `Process.wait(timeout_seconds=...)` while the
    process is still running. The process keeps running; wait again or kill it."""


#: The older name of `InvalidRequestError` (the same class).
ValidationError = InvalidRequestError
#: The older name of `APIConnectionError` (the same class).
TransportError = APIConnectionError


class TemplateBuildError(PandastackError):
    """A template build ended in failure; the message names the failed step and shows its
    output. `build` is the build's final status (a `TemplateBuildInfo`)."""

    def __init__(self, message: str, build: object = None) -> None:
        super().__init__(message)
        self.build = build


# -- which class an error answer raises ----------------------------------------------------

#: The class each error code of the server raises (`tests/sdk/test_shared_rules.py` holds it
#: to every code the server has, and no other).
CODE_EXCEPTIONS: dict[ErrorCode, type[APIError]] = {
    "bad_request": InvalidRequestError, "validation_error": InvalidRequestError,
    "unauthorized": AuthenticationError, "forbidden": PermissionDeniedError,
    "not_found": NotFoundError, "timeout": WaitTimeoutError, "conflict": ConflictError,
    "template_building": TemplateBuildingError, "payload_too_large": PayloadTooLargeError,
    "rate_limited": RateLimitError, "insufficient_storage": InsufficientStorageError,
    "quota_exceeded": QuotaExceededError,
    "internal": ServerError, "bad_gateway": ServerError, "unavailable": ServerError,
    "host_unavailable": HostUnavailableError, "host_lost": HostLostError,
    "volume_in_use": VolumeInUseError,
}
_BY_CODE: dict[str, type[APIError]] = {code: cls for code, cls in CODE_EXCEPTIONS.items()}
_CODE_STATUS: dict[str, int] = {code: status for code, status in ERROR_STATUS.items()}
_BY_STATUS: dict[int, type[APIError]] = {
    status: CODE_EXCEPTIONS[code] for status, code in STATUS_ERROR_CODE.items()}


def quota_error(message: str, status: int, code: str, request_id: str | None,
                retry_after: float | None, body: object) -> QuotaExceededError:
    """A `QuotaExceededError` with the limit, value and current use the envelope's error
    body names (None where it names none)."""
    fields = body if isinstance(body, dict) else {}
    def number(key: str) -> float | None:
        value = fields.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return value if ok else None
    limit = fields.get("limit")
    return QuotaExceededError(message, status=status, code=code, request_id=request_id,
                              retry_after=retry_after,
                              limit=limit if isinstance(limit, str) else None,
                              value=number("value"), current=number("current"))


def exception_class(status: int, code: str | None) -> type[APIError]:
    """The class of an error answer: its code's, when the code is the server's and goes with
    this status; else its status's (an unknown 5xx: `ServerError`; anything else: `APIError`)."""
    by_code = _BY_CODE.get(code or "")
    if by_code is not None and _CODE_STATUS.get(code or "") == status:
        return by_code
    return _BY_STATUS.get(status) or (ServerError if status >= 500 else APIError)
