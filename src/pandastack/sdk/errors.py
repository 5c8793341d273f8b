"""Every exception the SDK raises. Catch `PandastackError` to catch them all.

    PandastackError
    ├── ConfigError                 no API URL / key configured, or an unreadable config file
    ├── TransportError              the request never got an HTTP answer (wraps httpx's error)
    │   └── TransportTimeoutError   connect/read/write/pool timeout (also a builtin TimeoutError)
    ├── ProtocolError               the server answered, but not in the shape the wire types promise
    └── APIError                    the server answered with an error envelope (status, code, ...)
        ├── ValidationError         400, 422 (also raised locally, before sending, request_id None)
        ├── AuthenticationError     401: no key, unknown or revoked key
        ├── PermissionDeniedError   403: the key may not do this, or the guest said EACCES/EPERM
        ├── NotFoundError           404
        ├── WaitTimeoutError        408: the server stopped waiting (also a builtin TimeoutError)
        ├── ConflictError           409
        ├── PayloadTooLargeError    413
        ├── RateLimitError          429 (`retry_after` seconds, when the server said)
        └── ServerError             5xx

`APIError` carries what the server's envelope `{"error": {code, message, request_id}}` said;
quote `request_id` when reporting a problem: it finds the server's log lines for that request.
"""

from __future__ import annotations

import builtins

__all__ = [
    "APIError",
    "AuthenticationError",
    "ConfigError",
    "ConflictError",
    "NotFoundError",
    "PandastackError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "RateLimitError",
    "ServerError",
    "TransportError",
    "TransportTimeoutError",
    "ValidationError",
    "WaitTimeoutError",
]


class PandastackError(Exception):
    """Base class of every error raised by the pandastack SDK."""


class ConfigError(PandastackError):
    """The SDK does not know which server to talk to or which key to use."""


class TransportError(PandastackError):
    """The request did not get an HTTP response (DNS, connect, reset, broken stream...).

    The httpx exception is chained as `__cause__`.
    """


class TransportTimeoutError(TransportError, builtins.TimeoutError):
    """A connect, read, write or pool timeout of the HTTP client.

    For `exec` the read timeout is always longer than the command's own `timeout_seconds`, so this
    means the server or the network went silent, not that the command ran too long (a command that
    runs too long comes back as an `ExecResult` with `timed_out=True`).
    """


class ProtocolError(PandastackError):
    """The server replied, but the reply does not match the wire types (or a stream broke off)."""


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


class ValidationError(APIError):
    """The request was malformed or out of range (400/422, or rejected locally before sending)."""


class AuthenticationError(APIError):
    """The API key is missing, unknown or revoked (401)."""


class PermissionDeniedError(APIError):
    """Not allowed (403): the key lacks the right (e.g. key management needs an admin key), or
    the guest refused the file operation (EACCES, EPERM, EROFS)."""


class NotFoundError(APIError):
    """No such sandbox, process, file or key (404)."""


class WaitTimeoutError(APIError, builtins.TimeoutError):
    """The server stopped waiting (408), e.g. `Process.wait(timeout_seconds=...)` while the
    process is still running. The process keeps running; wait again or kill it."""


class ConflictError(APIError):
    """The request conflicts with the current state, e.g. the sandbox is not running (409)."""


class PayloadTooLargeError(APIError):
    """The request body is larger than the server accepts (413)."""


class RateLimitError(APIError):
    """Too many requests (429). `retry_after` is the server's hint in seconds, if it gave one."""

    def __init__(self, message: str, *, status: int, code: str,
                 request_id: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status=status, code=code, request_id=request_id)
        self.retry_after = retry_after


class ServerError(APIError):
    """The server failed (5xx): internal error, unavailable, gateway timeout."""
