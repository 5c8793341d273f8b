"""The streamed responses of the host API: an operation runs while its frames
(`hostport.frames`) go out as they come, and ends the body with its RESULT or ERROR frame.

Backpressure: the operation's frames wait in an `Outbox` of HIGH_WATER bytes; when the
control plane reads slower than the guest writes, `put` waits, so the guest-agent channel's
credit runs out and the guest process blocks on its pipe (nothing is buffered whole). If the
control plane goes away mid-stream, the operation is cancelled (an exec's process is killed
by the guest-agent client, a file transfer is abandoned): a listener waits for the ASGI
`http.disconnect` the whole time, since a quiet exec sends nothing that would notice.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pandastack.hostport.errors import HostError
from pandastack.hostport.frames import MEDIA_TYPE, Kind, encode, encode_chunks
from pandastack.hostport.host_api.codec import ErrorEnvelope, dump_json, encode_error

log = logging.getLogger("pandastack.agent")

HIGH_WATER = 1 << 20
_BYTE_KINDS = frozenset({Kind.STDOUT, Kind.STDERR, Kind.DATA})


class Outbox:
    """Frames waiting to be sent. `put` waits while `high_water` bytes are queued; `offer`
    (for callers that cannot wait: the build log's callback is synchronous) refuses
    instead, past `offer_limit`."""

    def __init__(self, high_water: int = HIGH_WATER, offer_limit: int = 8 * HIGH_WATER) -> None:
        self.high_water = high_water
        self.offer_limit = offer_limit
        self._frames: deque[bytes] = deque()
        self._bytes = 0
        self._closed = False
        self._readable = asyncio.Event()
        self._room = asyncio.Event()

    async def put(self, kind: Kind, payload: bytes) -> None:
        frames = encode_chunks(kind, payload) if kind in _BYTE_KINDS else [encode(kind, payload)]
        for frame in frames:
            while self._bytes >= self.high_water:
                self._room.clear()
                await self._room.wait()
            self._append(frame)

    def offer(self, kind: Kind, payload: bytes) -> bool:
        if self._bytes >= self.offer_limit:
            return False
        self._append(encode(kind, payload))
        return True

    def finish(self, final: bytes) -> None:
        self._append(final)
        self._closed = True

    async def take(self) -> bytes | None:
        """Everything queued, as one piece (None once the final frame went)."""
        while not self._frames:
            if self._closed:
                return None
            self._readable.clear()
            await self._readable.wait()
        data = b"".join(self._frames)
        self._frames.clear()
        self._bytes = 0
        self._room.set()
        return data

    def _append(self, frame: bytes) -> None:
        self._frames.append(frame)
        self._bytes += len(frame)
        self._readable.set()


Operation = Callable[[Outbox], Awaitable[object]]
"""A streamed operation: its frames go to the outbox; it returns its RESULT (a model or a
result dataclass)."""


def final_frame(result: object, exc: BaseException | None) -> bytes:
    if exc is None:
        assert result is not None
        return encode(Kind.RESULT, dump_json(result))
    return encode(Kind.ERROR, dump_json(encode_error(exc)))


class FramedResponse(Response):
    media_type = MEDIA_TYPE

    def __init__(self, operation: Operation, status_code: int = 200) -> None:
        # Not Response.__init__: it would declare a Content-Length for the empty body.
        self.status_code = status_code
        self.background = None
        self.init_headers(None)
        self.operation = operation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outbox = Outbox()

        async def operate() -> None:
            result: object = None
            failure: BaseException | None = None
            try:
                result = await self.operation(outbox)
            except Exception as exc:
                if not isinstance(exc, HostError | ValueError):
                    log.error("host API stream %s failed", scope.get("path"), exc_info=exc)
                failure = exc
            outbox.finish(final_frame(result, failure))

        async def pump() -> None:
            while (data := await outbox.take()) is not None:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        async with anyio.create_task_group() as group:
            async def then_stop(part: Callable[[], Awaitable[None]]) -> None:
                await part()
                group.cancel_scope.cancel()

            group.start_soon(operate)
            group.start_soon(then_stop, pump)
            group.start_soon(then_stop, disconnected)


def framed_responses(result: type, frames: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a streamed route: its frames, then `result` in the RESULT
    frame (or an ErrorEnvelope in the ERROR frame)."""
    return {200: {"model": result,
                  "description": f"{MEDIA_TYPE} body (spec: hostport/frames.py): {frames}, "
                                 f"then one RESULT frame with this JSON, or one ERROR frame "
                                 f"with an {ErrorEnvelope.__name__}"}}
