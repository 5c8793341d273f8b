"""Terminals on the host API: `POST .../pty` starts one (a row of the port's operation
table: plain.py), the WebSocket `.../pty/{pid}`
attaches to it (hostport.pty.relay). The WebSocket's first message says whether the attach
worked: `{"type": "attached", "pid": N}`, or `{"type": "error", "error": ErrorBody}` and a
close (so the client raises the host port's own error, as for any other route)."""

from __future__ import annotations

import hmac
import json

from fastapi import APIRouter, WebSocket

from pandastack.hostport import pty
from pandastack.hostport.host_api.codec import encode_error

ws_router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}")
"""Outside the token-checking router (its dependency reads an HTTP request): checks its own."""


@ws_router.websocket("/pty/{pid}")
async def connect_pty(websocket: WebSocket, sandbox_id: str, pid: int) -> None:
    expected: bytes = websocket.app.state.token
    given = websocket.headers.get("authorization", "").removeprefix("Bearer ").encode()
    if not hmac.compare_digest(given, expected):
        await websocket.close(pty.CLOSE_POLICY, "missing or wrong bearer token")
        return
    await websocket.accept()
    try:
        sandbox = await websocket.app.state.host.get(sandbox_id)
        session = await sandbox.pty_connect(pid)
    except Exception as exc:
        await websocket.send_text(json.dumps(
            {"type": "error", "error": encode_error(exc).error.model_dump(mode="json")}))
        await websocket.close(pty.CLOSE_NORMAL)
        return
    await websocket.send_text(json.dumps({"type": "attached", "pid": pid}))
    await pty.relay(websocket, session)
