"""A terminal on an agent: the host API's WebSocket `.../pty/{pid}` (host/api/pty.py) as a
`hostport.pty.PtySession`. A unix-socket agent is reached over its socket, a TCP one over
TCP, with the agent's bearer token as for every other call."""

from __future__ import annotations

import contextlib
import json
import ssl

from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed

from pandastack.hostport.errors import HostError, HostUnavailable
from pandastack.hostport.host_api.codec import ErrorBody, decode_error
from pandastack.hostport.pty import MAX_INPUT, PtyExit, check_dims, parse_exit, resize_message

from .calls import api_path

MAX_MESSAGE = 1 << 20
"""Largest message the agent may send (its output comes in guest-agent chunks of 256 KiB)."""


class RemotePty:
    def __init__(self, ws: ClientConnection, pid: int, address: str) -> None:
        self._ws = ws
        self._pid = pid
        self._address = address
        self._exited = False

    @property
    def pid(self) -> int:
        return self._pid

    async def receive(self) -> bytes | PtyExit:
        if self._exited:
            raise EOFError("the terminal's process has exited")
        while True:
            try:
                msg = await self._ws.recv()
            except ConnectionClosed as exc:
                raise HostUnavailable(f"host agent at {self._address}: the terminal's "
                                      f"connection closed ({exc})") from None
            if isinstance(msg, bytes):
                return msg
            done = parse_exit(msg)
            if done is not None:
                self._exited = True
                return done

    async def send(self, data: bytes) -> None:
        for start in range(0, len(data), MAX_INPUT):
            try:
                await self._ws.send(data[start:start + MAX_INPUT])
            except ConnectionClosed:
                return  # the terminal ended: what it was sent is lost, as with a pty's own

    async def resize(self, cols: int, rows: int) -> None:
        check_dims(cols, rows)
        with contextlib.suppress(ConnectionClosed):
            await self._ws.send(resize_message(cols, rows))

    async def close(self) -> None:
        await self._ws.close()


async def connect_pty(address: str, token: str, sandbox_id: str, pid: int,
                      timeout: float, *, tls: ssl.SSLContext | None = None) -> RemotePty:
    path = api_path("sandboxes", sandbox_id, "pty", pid)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        if address.startswith("unix:"):
            ws = await unix_connect(address.removeprefix("unix:"), f"ws://pandastack-agent{path}",
                                    additional_headers=headers, max_size=MAX_MESSAGE,
                                    open_timeout=timeout, compression=None)
        else:
            base = address if address.startswith(("http://", "https://")) else "http://" + address
            url = "ws" + base.rstrip("/").removeprefix("http") + path
            if tls is not None and url.startswith("wss:"):
                ws = await connect(url, additional_headers=headers, max_size=MAX_MESSAGE,
                                   open_timeout=timeout, compression=None, ssl=tls)
            else:
                ws = await connect(url, additional_headers=headers, max_size=MAX_MESSAGE,
                                   open_timeout=timeout, compression=None)
    except (OSError, TimeoutError) as exc:
        raise HostUnavailable(f"host agent at {address} cannot be reached: "
                              f"{type(exc).__name__}: {exc}") from exc
    try:
        first = await ws.recv()
        msg = json.loads(first) if isinstance(first, str) else None
        if not isinstance(msg, dict) or msg.get("type") not in ("attached", "error"):
            raise HostError(f"host agent at {address}: a terminal's WebSocket opened with "
                            f"{str(first)[:100]!r}")
        if msg["type"] == "error":
            raise decode_error(ErrorBody.model_validate(msg.get("error")))
    except ConnectionClosed as exc:
        await ws.close()
        raise HostUnavailable(f"host agent at {address}: the terminal's WebSocket closed "
                              f"({exc})") from None
    except BaseException:
        await ws.close()
        raise
    return RemotePty(ws, pid, address)
