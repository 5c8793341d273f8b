"""WebSocket relay between a client of the API (an ASGI WebSocket) and a port inside a
sandbox (a `websockets` client connection).

The upstream connection is opened first, so that the subprotocol it picks is the one the
client's handshake is accepted with. Then text and binary messages flow both ways until
either side closes; its close code and reason are passed on to the other side (codes that
cannot be sent on the wire, such as 1005 "no status" and 1006 "abnormal", are mapped onto
ones that can).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from starlette.websockets import WebSocket, WebSocketState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

log = logging.getLogger("pandastack.server")

# Close codes (RFC 6455 section 7.4; 1012-1014 registered by IANA).
NORMAL = 1000
GOING_AWAY = 1001
NO_STATUS = 1005
ABNORMAL = 1006
INTERNAL_ERROR = 1011
BAD_GATEWAY = 1014
MAX_REASON_BYTES = 123  # a close frame's payload is at most 125 bytes, 2 of them the code

# What the relay buffers per message (uvicorn's own default limit for incoming messages).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
UPSTREAM_CLOSE_TIMEOUT = 5.0
# Headers of the upstream's handshake response not passed on to the client's handshake.
RESPONSE_DROP = frozenset({"date", "server", "content-length", "content-type"})


def close_reason(text: str) -> str:
    """`text` cut to what fits in a close frame (123 bytes of UTF-8)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_REASON_BYTES:
        return text
    return data[:MAX_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."


def sendable(code: int | None, *, abnormal: int) -> int:
    """A close code that may be sent in a close frame for a `code` that was received
    (None: the connection ended without one)."""
    if code is None or code == ABNORMAL:
        return abnormal
    if code in (NORMAL, GOING_AWAY, 1002, 1003) or 1007 <= code <= BAD_GATEWAY \
            or 3000 <= code <= 4999:
        return code
    return NORMAL  # 1005 (no status), reserved and unknown codes


def subprotocols_of(client: WebSocket) -> list[Subprotocol]:
    return [Subprotocol(p) for p in client.scope.get("subprotocols", ())]


async def open_upstream(uri: str, headers: Sequence[tuple[str, str]],
                        subprotocols: Sequence[Subprotocol], timeout: float) -> ClientConnection:
    """Connect and complete the handshake within `timeout` seconds. No proxy from the
    environment, no User-Agent of its own (the client's is among `headers`), no
    compression (the hop is local)."""
    return await connect(uri, additional_headers=list(headers),
                         subprotocols=list(subprotocols) or None, compression=None,
                         proxy=None, user_agent_header=None, open_timeout=timeout,
                         close_timeout=UPSTREAM_CLOSE_TIMEOUT, max_size=MAX_MESSAGE_BYTES)


def response_headers(upstream: ClientConnection,
                     hop_by_hop: frozenset[str]) -> list[tuple[bytes, bytes]]:
    """The upstream handshake response's own headers (cookies, say) for the client's."""
    if upstream.response is None:
        return []
    return [(name.lower().encode("latin-1"), value.encode("latin-1", "replace"))
            for name, value in upstream.response.headers.raw_items()
            if name.lower() not in hop_by_hop and name.lower() not in RESPONSE_DROP
            and not name.lower().startswith("sec-websocket-")]


async def refuse_after_accept(client: WebSocket, code: int, reason: str) -> None:
    """Accept the handshake only to close it with `code`: a browser sees close codes, never
    the HTTP status of a refused handshake."""
    with contextlib.suppress(Exception):
        await client.accept()
        await client.close(code, close_reason(reason))


@dataclass
class Ending:
    """How the relay ended: which side closed first, with what code and reason."""
    side: str = ""
    code: int = NORMAL
    reason: str = ""


async def relay(client: WebSocket, upstream: ClientConnection, where: str) -> Ending:
    """Relay messages both ways until one side closes; close the other side likewise.
    `client` has been accepted. Closes `upstream` in every case."""
    ending = Ending()

    async def upstream_to_client(cancel: anyio.CancelScope) -> None:
        try:
            async for message in upstream:
                if isinstance(message, str):
                    await client.send({"type": "websocket.send", "text": message})
                else:
                    await client.send({"type": "websocket.send", "bytes": message})
        except ConnectionClosed:
            pass
        except Exception as exc:  # the client went away while we sent to it
            log.debug("%s: sending to the client failed: %s", where, exc)
            ending.side = ending.side or "client"
            ending.code = GOING_AWAY
            cancel.cancel()
            return
        if not ending.side:
            ending.side = "upstream"
            received = upstream.close_code
            ending.code = sendable(received, abnormal=INTERNAL_ERROR)
            ending.reason = ((upstream.close_reason or "") if received != ABNORMAL
                             else "the connection to the sandbox's port broke off")
        cancel.cancel()

    async def client_to_upstream(cancel: anyio.CancelScope) -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                if not ending.side:
                    ending.side = "client"
                    ending.code = sendable(message.get("code"), abnormal=GOING_AWAY)
                    ending.reason = str(message.get("reason") or "")
                cancel.cancel()
                return
            text, data = message.get("text"), message.get("bytes")
            try:
                await upstream.send(text if text is not None else (data or b""))
            except ConnectionClosed:
                return  # upstream_to_client sees the close and ends the relay

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(upstream_to_client, tg.cancel_scope)
            tg.start_soon(client_to_upstream, tg.cancel_scope)
    finally:
        with anyio.CancelScope(shield=True):
            if ending.side == "upstream" and client.application_state == \
                    WebSocketState.CONNECTED and \
                    client.client_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await client.close(ending.code, close_reason(ending.reason))
            code = ending.code if ending.side == "client" else GOING_AWAY
            with contextlib.suppress(Exception):
                await upstream.close(code, close_reason(ending.reason))
    return ending
