"""`hostport.pty.relay`, the loop between a terminal's WebSocket and its session, against a
recording session (pure logic: the real ones are tested on VMs in tests/e2e/test_pty.py and
tests/server/hostclient/test_pty_hostclient_vm.py): order of input and resizes, the bounds,
the exit."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fastapi import FastAPI, WebSocket
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from pandastack.hostport import pty


class Recording:
    def __init__(self) -> None:
        self.pid = 7
        self.got: list[object] = []
        self.output: asyncio.Queue[bytes | pty.PtyExit] = asyncio.Queue()
        self.closed = False

    async def receive(self) -> bytes | pty.PtyExit:
        return await self.output.get()

    async def send(self, data: bytes) -> None:
        self.got.append(data)
        if data == b"exit\r":
            await self.output.put(b"bye")
            await self.output.put(pty.PtyExit(3))

    async def resize(self, cols: int, rows: int) -> None:
        self.got.append((cols, rows))

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def app_and_session() -> tuple[FastAPI, list[Recording]]:
    app = FastAPI()
    sessions: list[Recording] = []

    @app.websocket("/t")
    async def terminal(websocket: WebSocket) -> None:
        await websocket.accept()
        session = Recording()
        sessions.append(session)
        await pty.relay(websocket, session)

    return app, sessions


def test_input_and_resizes_in_order_then_the_exit(
        app_and_session: tuple[FastAPI, list[Recording]]) -> None:
    app, sessions = app_and_session
    with TestClient(app).websocket_connect("/t") as ws:
        ws.send_bytes(b"ls\r")
        ws.send_text(pty.resize_message(100, 30))
        ws.send_bytes(b"exit\r")
        assert ws.receive_bytes() == b"bye"
        assert json.loads(ws.receive_text()) == {"type": "exit", "exit_code": 3, "signal": None}
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == pty.CLOSE_NORMAL
    (session,) = sessions
    assert session.got == [b"ls\r", (100, 30), b"exit\r"] and session.closed


@pytest.mark.parametrize(("message", "code"), [
    ('{"type": "resize", "cols": 0, "rows": 5}', pty.CLOSE_POLICY),
    ('{"type": "resize", "cols": true, "rows": 5}', pty.CLOSE_POLICY),
    ('{"type": "paste"}', pty.CLOSE_POLICY),
    ("not json", pty.CLOSE_POLICY),
    ("[" * 100_000, pty.CLOSE_POLICY),
    (b"x" * (pty.MAX_INPUT + 1), pty.CLOSE_TOO_BIG),
])
def test_what_a_client_may_send_is_bounded(
        app_and_session: tuple[FastAPI, list[Recording]], message: str | bytes,
        code: int) -> None:
    app, sessions = app_and_session
    with TestClient(app).websocket_connect("/t") as ws:
        if isinstance(message, bytes):
            ws.send_bytes(message)
        else:
            ws.send_text(message)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == code
    (session,) = sessions
    assert session.got == [] and session.closed


def test_a_client_that_leaves_detaches(app_and_session: tuple[FastAPI, list[Recording]]) -> None:
    app, sessions = app_and_session
    with TestClient(app).websocket_connect("/t") as ws:
        ws.send_bytes(b"a")
    (session,) = sessions
    deadline = time.monotonic() + 30
    while not session.closed and time.monotonic() < deadline:  # the relay's own loop sees it
        time.sleep(0.01)
    assert session.closed and session.got == [b"a"]
