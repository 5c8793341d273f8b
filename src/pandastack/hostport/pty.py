"""Terminals on the host port: what `SandboxPort.pty_create` starts and `pty_connect`
attaches to (docs/adr/0028-terminals.md), and the bounds every hop checks.

A session is one attachment to a terminal process in the guest: `receive()` gives its
output (what the guest's ring held first, then live), and finally one `PtyExit`; `send`
types, `resize` sets the window. `close()` detaches; the process runs on (kill it with
`SandboxPort.signal`). Several sessions may attach to one terminal at once: each sees all
of its output, and keystrokes from any of them reach it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# The public API's bounds hold on the host API too (the guest agent has its own MAX_DIM).
from pandastack.rules import PTY_DEFAULT_COLS as DEFAULT_COLS
from pandastack.rules import PTY_DEFAULT_ROWS as DEFAULT_ROWS
from pandastack.rules import PTY_MAX_CONTROL_CHARS as MAX_CONTROL
from pandastack.rules import PTY_MAX_DIM as MAX_DIM
from pandastack.rules import PTY_MAX_INPUT_BYTES as MAX_INPUT

__all__ = ["DEFAULT_COLS", "DEFAULT_ROWS", "MAX_CONTROL", "MAX_DIM", "MAX_INPUT", "PtyExit",
           "PtySession", "check_dims", "parse_control", "relay"]


def check_dims(cols: int, rows: int) -> None:
    if not (1 <= cols <= MAX_DIM and 1 <= rows <= MAX_DIM):
        raise ValueError(f"cols and rows must be in 1..{MAX_DIM} (got {cols}x{rows})")


@dataclass(frozen=True)
class PtyExit:
    """How a terminal's process ended: `exit_code` (128+N when killed by signal N)."""

    exit_code: int
    signal: int | None = None


class PtySession(Protocol):
    @property
    def pid(self) -> int: ...

    async def receive(self) -> bytes | PtyExit:
        """The next piece of output, or the exit (the last thing a session receives)."""
        ...

    async def send(self, data: bytes) -> None: ...

    async def resize(self, cols: int, rows: int) -> None: ...

    async def close(self) -> None:
        """Detach (idempotent): the process keeps running."""
        ...


# -- the WebSocket of a terminal (the public API's and the host API's) ----------------------
# Binary messages are the terminal's bytes both ways; text messages are small JSON objects:
# to the terminal {"type": "resize", "cols": C, "rows": R}, from it, last,
# {"type": "exit", "exit_code": N, "signal": S | null}, then a normal close.

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
"""A control message that is not one (bad JSON, unknown type, bad size)."""
CLOSE_TOO_BIG = 1009
CLOSE_ERROR = 1011


class BadControl(ValueError):
    """A text message of a terminal's WebSocket that is not a valid control message."""


def parse_control(text: str) -> tuple[int, int]:
    """(cols, rows) of a resize message; BadControl for anything else."""
    if len(text) > MAX_CONTROL:
        raise BadControl(f"control message over {MAX_CONTROL} characters")
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError):
        raise BadControl("control message is not JSON") from None
    if not isinstance(msg, dict) or msg.get("type") != "resize":
        raise BadControl('the only control message is {"type": "resize", "cols", "rows"}')
    cols, rows = msg.get("cols"), msg.get("rows")
    if not (isinstance(cols, int) and isinstance(rows, int)) or isinstance(cols, bool) \
            or isinstance(rows, bool):
        raise BadControl("resize needs int cols and rows")
    try:
        check_dims(cols, rows)
    except ValueError as exc:
        raise BadControl(str(exc)) from None
    return cols, rows


def resize_message(cols: int, rows: int) -> str:
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


def exit_message(done: PtyExit) -> str:
    return json.dumps({"type": "exit", "exit_code": done.exit_code, "signal": done.signal})


def parse_exit(text: str) -> PtyExit | None:
    """The exit a terminal's text message announces (None if it is not an exit)."""
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(msg, dict) or msg.get("type") != "exit":
        return None
    code, sig = msg.get("exit_code"), msg.get("signal")
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    return PtyExit(code, sig if isinstance(sig, int) and not isinstance(sig, bool) else None)


class MessageSocket(Protocol):
    """What `relay` needs of a server-side WebSocket (Starlette's has it)."""

    async def receive(self) -> Mapping[str, Any]: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


async def relay(ws: MessageSocket, session: PtySession) -> None:
    """Carry an accepted WebSocket to and from `session` until the process exits (the exit
    message, then a normal close) or the client leaves; then detach. Output waits for the
    client to take it (that is the terminal's backpressure); input beyond MAX_INPUT per
    message or a bad control message closes the socket (1009, 1008)."""

    async def output() -> tuple[int, str]:
        while True:
            item = await session.receive()
            if isinstance(item, PtyExit):
                await ws.send_text(exit_message(item))
                return CLOSE_NORMAL, ""
            await ws.send_bytes(item)

    async def keyboard() -> tuple[int, str] | None:
        while True:
            msg = await ws.receive()
            if msg.get("type") == "websocket.disconnect":
                return None
            data, text = msg.get("bytes"), msg.get("text")
            if data is not None:
                if len(data) > MAX_INPUT:
                    return CLOSE_TOO_BIG, f"input messages are at most {MAX_INPUT} bytes"
                await session.send(data)
            elif text is not None:
                try:
                    cols, rows = parse_control(text)
                except BadControl as exc:
                    return CLOSE_POLICY, str(exc)[:120]
                await session.resize(cols, rows)

    tasks = [asyncio.ensure_future(output()), asyncio.ensure_future(keyboard())]
    close: tuple[int, str] | None = None
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        first = done.pop()
        try:
            close = first.result()
        except Exception as exc:  # the host or guest side failed: tell the client why
            close = CLOSE_ERROR, f"{type(exc).__name__}: {exc}"[:120]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await session.close()
    if close is not None:
        with contextlib.suppress(Exception):
            await ws.close(close[0], close[1] or None)
