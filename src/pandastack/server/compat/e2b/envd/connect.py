"""Connect RPC, the JSON codec only, as E2B's SDKs speak it (connectrpc.com/docs/protocol).

- Unary: `POST /<package>.<Service>/<Method>`, `Content-Type: application/json`, the request
  message as the body; the answer is the reply message, or a non-200 with
  `{"code": "<connect code>", "message": ...}`.
- Server streaming: `Content-Type: application/connect+json`; the request is one envelope
  (1 flag byte, 4-byte big-endian length, JSON); the answer is 200 and a run of envelopes, the
  last with flag 0x02 carrying `{}` or `{"error": {...}}` (an error after the stream began
  travels there, never as a status).
- Client streaming: a run of request envelopes, answered as a stream of one message.

Messages are plain dicts in protobuf's JSON mapping (lowerCamelCase names, bytes base64,
64-bit integers as strings, enums by name); `field()` reads a request's field under either
name, as protobuf's JSON parsers do. Compression is refused (`unimplemented`): the SDKs send
none. Every message is bounded (`MAX_MESSAGE_BYTES`) before it is parsed.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

log = logging.getLogger("pandastack.server")

Message = dict[str, Any]
MAX_MESSAGE_BYTES = 4 << 20
END_STREAM = 0x02
COMPRESSED = 0x01
STREAM_TYPES = ("application/connect+json",)
UNARY_TYPES = ("application/json",)

# Connect's codes and the HTTP status a unary error carries (connectrpc.com/docs/protocol).
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403,
    "resource_exhausted": 429, "failed_precondition": 400, "aborted": 409,
    "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}
# The other way, for our own errors met inside a handler.
_CODE_OF_STATUS = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
                   404: "not_found", 409: "already_exists", 412: "failed_precondition",
                   413: "resource_exhausted", 429: "resource_exhausted", 501: "unimplemented",
                   502: "unavailable", 503: "unavailable", 504: "deadline_exceeded"}


class ConnectError(Exception):
    def __init__(self, code: str, message: str) -> None:
        assert code in HTTP_STATUS, code
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> Message:
        return {"code": self.code, "message": self.message}


def code_of_status(status: int) -> str:
    return _CODE_OF_STATUS.get(status, "internal" if status >= 500 else "invalid_argument")


@dataclass(frozen=True)
class Unary:
    handler: Callable[[Request, Message], Awaitable[Message]]
    kind: Literal["unary"] = "unary"


@dataclass(frozen=True)
class ServerStream:
    handler: Callable[[Request, Message], AsyncIterator[Message]]
    kind: Literal["server_stream"] = "server_stream"


@dataclass(frozen=True)
class ClientStream:
    handler: Callable[[Request, AsyncIterator[Message]], Awaitable[Message]]
    kind: Literal["client_stream"] = "client_stream"


Method = Unary | ServerStream | ClientStream


def field(message: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A request field by its JSON name or its proto name (`exitCode` / `exit_code`)."""
    if name in message:
        return message[name]
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
    return message.get(snake, default)


def envelope(payload: Message, flags: int = 0) -> bytes:
    data = json.dumps(payload, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: ConnectError | None = None) -> bytes:
    return envelope({"error": error.body()} if error is not None else {}, END_STREAM)


def _parse(data: bytes) -> Message:
    try:
        message = json.loads(data) if data else {}
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ConnectError("invalid_argument", "the message is not JSON") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return message


async def read_envelopes(request: Request) -> AsyncIterator[Message]:
    """The request's envelopes, each bounded, until the body ends (a partial one is an error)."""
    buffer = bytearray()
    async for chunk in request.stream():
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if length > MAX_MESSAGE_BYTES:
                raise ConnectError("resource_exhausted",
                                   f"a message of {length} bytes is over {MAX_MESSAGE_BYTES}")
            if flags & COMPRESSED:
                raise ConnectError("unimplemented", "compressed messages are not supported")
            if len(buffer) < 5 + length:
                break
            data = bytes(buffer[5:5 + length])
            del buffer[:5 + length]
            if flags & END_STREAM:
                return
            yield _parse(data)
        if len(buffer) > MAX_MESSAGE_BYTES + 5:
            raise ConnectError("resource_exhausted", "message too large")
    if buffer:
        raise ConnectError("invalid_argument", "the request ends inside an envelope")


async def _read_unary(request: Request) -> Message:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_MESSAGE_BYTES:
            raise ConnectError("resource_exhausted",
                               f"a message over {MAX_MESSAGE_BYTES} bytes")
    return _parse(bytes(body))


def unary_error(error: ConnectError) -> Response:
    return JSONResponse(error.body(), status_code=HTTP_STATUS[error.code])


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def serve(request: Request, method: Method,
                translate: Callable[[BaseException], ConnectError | None]) -> Response:
    """Answer one call of `method`. `translate` turns the service layer's errors into Connect
    ones; anything it returns None for is a bug of ours (`internal`, logged by the caller)."""
    media = _media_type(request)
    streaming = method.kind != "unary"
    if media not in (STREAM_TYPES if streaming else UNARY_TYPES):
        want = (STREAM_TYPES if streaming else UNARY_TYPES)[0]
        # 415 as connect-go answers a codec it lacks; the body says why, in Connect's shape
        return JSONResponse(ConnectError(
            "invalid_argument", f"this method takes Content-Type {want} (the JSON codec), "
            f"not {media or 'none'}").body(), status_code=415)
    encoding = request.headers.get(
        "connect-content-encoding" if streaming else "content-encoding", "identity")
    if encoding.strip().lower() not in ("identity", ""):
        return unary_error(ConnectError("unimplemented", f"compression {encoding!r} is not "
                                        "supported"))
    if isinstance(method, Unary):
        try:
            reply = await method.handler(request, await _read_unary(request))
        except ConnectError as exc:
            return unary_error(exc)
        except Exception as exc:
            error = translate(exc)
            if error is None:
                raise
            return unary_error(error)
        return JSONResponse(reply)
    if isinstance(method, ClientStream):
        try:
            reply = await method.handler(request, read_envelopes(request))
            answer = envelope(reply) + end_stream()
        except ConnectError as exc:
            answer = end_stream(exc)
        except Exception as exc:
            error = translate(exc)
            if error is None:
                raise
            answer = end_stream(error)
        return Response(answer, media_type=STREAM_TYPES[0])
    try:
        first = await anext(read_envelopes(request), None)
    except ConnectError as exc:
        return unary_error(exc)
    if first is None:
        return unary_error(ConnectError("invalid_argument", "a stream call needs its request "
                                        "message"))
    messages = method.handler(request, first)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for message in messages:
                yield envelope(message)
        except ConnectError as exc:
            yield end_stream(exc)
            return
        except Exception as exc:
            error = translate(exc)
            if error is None:
                # the 200 is sent: the stream still ends in Connect's terms, not cut off
                log.exception("unhandled error in a Connect stream (%s)", request.url.path)
                error = ConnectError("internal", "internal error")
            yield end_stream(error)
            return
        yield end_stream()

    return StreamingResponse(body(), media_type=STREAM_TYPES[0])
