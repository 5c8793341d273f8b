"""Server-Sent Events, as every streaming route sends them: the frame format, the envelope a
stream ends with when the work behind it fails, and the response itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import api_error_of, envelope, log, request_id_of

T = TypeVar("T")
Item = TypeVar("Item")

#: The OpenAPI `responses` of a streaming route's 200.
SSE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
          "description": "the event stream"}}


def sse(event: str, data: object) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def failure_envelope(exc: BaseException, request_id: str, what: str) -> dict[str, Any]:
    """The error envelope for a failure met after the stream's 200 was sent (mapped as the
    non-streaming routes map it; anything unexpected is logged and told as "internal")."""
    api = api_error_of(exc)
    if api is not None:
        return envelope(api.code, api.message, request_id)
    log.error("%s failed (request %s)", what, request_id, exc_info=exc)
    return envelope("internal", "internal error", request_id)


def stopping(scope: Scope) -> bool:
    """Whether the server is stopping (`serve` marks it when SIGTERM arrives)."""
    app = scope.get("app")
    return bool(getattr(getattr(app, "state", None), "stopping", False))


class _HeldStream(StreamingResponse):
    """A stream that holds something (a team's stream slot) until it is over, however it
    ends: sent to the end, the client gone, or a send that failed. One the server's stop
    cuts (after its grace) ends with an `error` event saying so, not a bare reset, which
    tells a client to reconnect elsewhere or later."""

    def __init__(self, frames: AsyncIterator[bytes], release: Callable[[], None] | None,
                 headers: dict[str, str]) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            if not stopping(scope):
                raise
            last = sse("error", envelope("unavailable", "the server is stopping: reconnect",
                                         request_id_of(scope)))
            with contextlib.suppress(Exception):  # the client may be gone as well
                await send({"type": "http.response.body", "body": last, "more_body": False})
        finally:
            if self._release is not None:
                self._release()


def event_stream(frames: AsyncIterator[bytes],
                 release: Callable[[], None] | None = None) -> StreamingResponse:
    """`release`: called once the stream is over (see `_HeldStream`)."""
    # No proxy buffering: events must reach the client as they happen.
    return _HeldStream(frames, release, {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@dataclass(frozen=True)
class Finished(Generic[T]):
    """The end of `relayed`: what the work returned, or the exception it raised."""

    result: T | None = None
    error: Exception | None = None


async def relayed(work: Callable[[asyncio.Queue[Item | None]], Awaitable[T]],
                  queue_size: int) -> AsyncGenerator[Item | Finished[T], None]:
    """Run `work` in a task, yield what it puts into its (bounded) queue as it arrives, then
    one `Finished`. If the client goes away first, the work is cancelled and awaited."""
    queue: asyncio.Queue[Item | None] = asyncio.Queue(queue_size)

    async def run() -> T:
        try:
            return await work(queue)
        finally:
            await queue.put(None)

    task = asyncio.create_task(run())
    try:
        while (item := await queue.get()) is not None:
            yield item
        try:
            result = await task
        except Exception as exc:
            yield Finished(error=exc)
        else:
            yield Finished(result=result)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
