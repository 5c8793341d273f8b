"""Terminals without I/O: the create call, the WebSocket's address and headers, and what its
messages mean (wire_pty.PTY_WEBSOCKET), shared by `Pty` and `AsyncPty`."""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from pandastack.sdk._base import (
    Call,
    client_headers,
    encode,
    error_from_response,
    model_decoder,
    sandbox_path,
)
from pandastack.sdk._http import tls_context
from pandastack.sdk.config import ClientConfig
from pandastack.sdk.errors import APIConnectionError, APIError, InvalidRequestError
from pandastack.wire import pty as wire_pty

PtyDataCallback = Callable[[bytes], object]
"""Called with each piece of the terminal's output (bytes: a terminal's output is not always
whole UTF-8 characters)."""
AsyncPtyDataCallback = Callable[[bytes], Awaitable[object] | object]

MAX_MESSAGE = 1 << 20
"""Largest message the server may send (output comes in pieces of at most 256 KiB)."""


def create_pty_call(sandbox_id: str, *, cols: int, rows: int, cmd: str | Sequence[str] | None,
                    env: Mapping[str, str] | None, cwd: str | None,
                    user: str | None) -> Call[wire_pty.PtyInfo]:
    body = encode(wire_pty.PtyCreateRequest, cols=cols, rows=rows,
                  cmd=cmd if cmd is None or isinstance(cmd, str) else list(cmd),
                  env=None if env is None else dict(env), cwd=cwd, user=user)
    return Call("POST", sandbox_path(sandbox_id, "pty"), model_decoder(wire_pty.PtyInfo),
                json=body)


def ws_url(config: ClientConfig, sandbox_id: str, pid: int) -> str:
    base = config.api_url.rstrip("/")
    scheme, sep, rest = base.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise InvalidRequestError(f"api_url {config.api_url!r} is not http(s)", status=422,
                                  code="validation_error")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{sandbox_path(sandbox_id, 'pty', pid)}"


def ws_ssl(config: ClientConfig) -> ssl.SSLContext | None:
    """The `ssl=` of the terminal's WebSocket: for wss://, the SDK's verifying context (its
    CA bundle); None for ws://, where websockets refuses one."""
    if not config.api_url.startswith("https://"):
        return None
    return tls_context(config.ca_bundle)


def ws_tls(config: ClientConfig) -> dict[str, Any]:
    """`ssl=` as keywords, for websockets' asyncio client (which refuses ssl=None for
    wss://)."""
    ctx = ws_ssl(config)
    return {} if ctx is None else {"ssl": ctx}


def ws_headers(config: ClientConfig) -> dict[str, str]:
    return {k: v for k, v in client_headers(config).items() if k != "Accept"}


def check_dims(cols: int, rows: int) -> None:
    if not (1 <= cols <= wire_pty.MAX_DIM and 1 <= rows <= wire_pty.MAX_DIM):
        raise InvalidRequestError(f"cols and rows must be in 1..{wire_pty.MAX_DIM}",
                                  status=422, code="validation_error")


def input_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def chunks(data: bytes) -> list[bytes]:
    """`data` cut into messages the server takes (a paste may be larger than one)."""
    step = wire_pty.MAX_INPUT
    return [data[i:i + step] for i in range(0, len(data), step)]


def resize_message(cols: int, rows: int) -> str:
    check_dims(cols, rows)
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


class PtyState:
    """What the messages received so far say: the exit, once it came."""

    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.signal: int | None = None

    @property
    def exited(self) -> bool:
        return self.exit_code is not None

    def take(self, message: str | bytes) -> bytes | None:
        """The output a message carries (None for a control message, such as the exit)."""
        if isinstance(message, bytes):
            return message
        try:
            msg: Any = json.loads(message)
        except ValueError:
            return None
        if isinstance(msg, dict) and msg.get("type") == "exit":
            code, sig = msg.get("exit_code"), msg.get("signal")
            self.exit_code = code if isinstance(code, int) else -1
            self.signal = sig if isinstance(sig, int) else None
        return None


def handshake_error(status: int, headers: Mapping[str, str], body: bytes,
                    label: str) -> APIError:
    """The API error of a refused handshake (its body is the error envelope)."""
    response = httpx.Response(status, headers=dict(headers), content=body,
                              request=httpx.Request("GET", "ws://pandastack/" + label))
    return error_from_response(response)


def closed_error(code: int | None, reason: str, label: str) -> APIConnectionError:
    return APIConnectionError(f"{label}: the terminal's connection closed before its exit "
                              f"(code {code}{': ' + reason if reason else ''})")
