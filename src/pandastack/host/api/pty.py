"""Terminals on the host API: `POST .../pty` starts one, the WebSocket `.../pty/{pid}`
attaches to it (hostport.pty.relay). The WebSocket's first message says whether the attach
worked: `{"type": "attached", "pid": N}`, or `{"type": "error", "error": ErrorBody}` and a
close (so the client raises the host port's own error, as for any other route)."""

from __future__ import annotations

import hmac
import json

from fastapi import APIRouter, WebSocket

from pandastack.hostport import pty
from pandastack.hostport.wire import PtyRequest, Spawned, encode_error

from .deps import Sandbox

router = APIRouter(prefix="/sandboxes/{sandbox_id}", tags=["processes"])
ws_router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}")
"""Outside the token-checking router (its dependency reads an HTTP request): checks its own."""


@router.post("/pty", status_code=201, operation_id="createPty")
async def create_pty(body: PtyRequest, sandbox: Sandbox) -> Spawned:
    return Spawned(pid=await sandbox.pty_create(
        cols=body.cols, rows=body.rows, cmd=body.cmd, env=body.env, cwd=body.cwd,
        user=body.user))


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
