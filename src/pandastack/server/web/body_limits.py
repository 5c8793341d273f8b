"""Request body limits, enforced in front of the app so that an oversized body is never read
into memory: a declared `Content-Length` over the limit is refused before a byte of the body is
read, and a body without one (chunked) is counted while the app reads it and cut off with a 413
as soon as it passes the limit. Raw uploads (file writes, process stdin) have their own, larger
limit and stay streamed; every other body is JSON and gets the small one."""

from __future__ import annotations

import asyncio
import re
import time

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pandastack.wire.sandboxes import ErrorBody, ErrorEnvelope

from .errors import request_id_of

# Routes whose body is raw bytes streamed on to the guest (PUT …/files, POST …/stdin, any
# request to an exposed port except the API's own POST …/signed-url); "*": any method.
RAW_BODY_ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("PUT", re.compile(r"^/v1/sandboxes/[^/]+/files$")),
    ("POST", re.compile(r"^/v1/sandboxes/[^/]+/processes/[^/]+/stdin$")),
    ("*", re.compile(r"^/v1/sandboxes/[^/]+/ports/[^/]+/")),
)
# Template builds carry the files their COPY steps copy (base64 in JSON): a limit of their own.
TEMPLATE_BODY_ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("POST", re.compile(r"^/v1/templates$")),
)
JSON_BODY_ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("POST", re.compile(r"^/v1/sandboxes/[^/]+/ports/[^/]+/signed-url$")),
)


# After a 413 the rest of the body is read and dropped for a moment before the connection is
# closed: closing a socket with unread bytes makes the kernel send a reset and throw away what
# it had not sent yet, the 413 included, so a client still writing its body got "connection
# reset" instead of the error. Bounded in bytes and time, so a refused body is never read whole.
DRAIN_MAX_BYTES = 16 * 2**20
DRAIN_MAX_SECONDS = 1.0


async def drain(receive: Receive) -> None:
    """Reads and drops the rest of a request body, up to the bounds above."""
    dropped = 0
    deadline = time.monotonic() + DRAIN_MAX_SECONDS
    while dropped <= DRAIN_MAX_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except (TimeoutError, OSError):
            return
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class BodyTooLarge(StarletteHTTPException):
    """Raised from `receive` once a streamed body passes its limit; the app's handlers turn it
    into the 413 envelope (FastAPI re-raises HTTP exceptions met while parsing a body)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the {limit}-byte limit")
        self.limit = limit


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None if it has none (or one the server will reject)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


class BodyLimitMiddleware:
    """Pure ASGI: refuses bodies over the limit with a 413 envelope and `Connection: close`;
    the rest of the body is dropped for at most `DRAIN_MAX_BYTES` or `DRAIN_MAX_SECONDS`
    (see `drain`), never read whole."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_upload_bytes: int,
                 max_template_bytes: int | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.max_template_bytes = max_template_bytes or max_body_bytes

    def limit_for(self, scope: Scope) -> int:
        method, path = scope.get("method", ""), scope.get("path", "")
        if any(m == method and rx.match(path) for m, rx in JSON_BODY_ROUTES):
            return self.max_body_bytes
        if any(m == method and rx.match(path) for m, rx in TEMPLATE_BODY_ROUTES):
            return self.max_template_bytes
        if any(m in (method, "*") and rx.match(path) for m, rx in RAW_BODY_ROUTES):
            return self.max_upload_bytes
        return self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self.refuse(scope, receive, send, limit)
            return

        received = 0
        over = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge(limit)
            return message

        async def closing_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if over:  # do not let the server read (and drop) the rest of the body
                    headers = [(k, v) for k, v in message.get("headers", [])
                               if k.lower() != b"connection"]
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            elif over and message["type"] == "http.response.body" \
                    and not message.get("more_body", False):
                await send({**message, "more_body": True})
                await drain(receive)
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        try:
            await self.app(scope, counting_receive, closing_send)
        except BodyTooLarge:
            if started:
                raise
            await self.refuse(scope, receive, send, limit)

    @staticmethod
    async def refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        rid = request_id_of(scope)
        body = ErrorEnvelope(error=ErrorBody(
            code="payload_too_large", message=f"request body over the {limit}-byte limit",
            request_id=rid)).model_dump_json().encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        # the whole answer goes out first (its length is declared), then the drain
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await drain(receive)
        await send({"type": "http.response.body", "body": b""})
