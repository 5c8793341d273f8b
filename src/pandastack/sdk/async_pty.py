"""`sbx.pty` of an `AsyncSandbox`: the async twins of `pty.py`."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from pandastack.sdk import _base, _commands, _pty
from pandastack.sdk._http import AsyncHTTP
from pandastack.sdk._pty import AsyncPtyDataCallback
from pandastack.sdk.errors import APIConnectionError, InvalidRequestError
from pandastack.wire import pty as wire_pty

__all__ = ["AsyncPty", "AsyncTerminals"]

SIGKILL = 9


async def _open(http: AsyncHTTP, sandbox_id: str, pid: int) -> ClientConnection:
    label = f"pty {pid} of {sandbox_id}"
    try:
        return await connect(_pty.ws_url(http.config, sandbox_id, pid),
                             additional_headers=_pty.ws_headers(http.config),
                             max_size=_pty.MAX_MESSAGE, compression=None,
                             open_timeout=http.timeout.connect or 30,
                             **_pty.ws_tls(http.config))
    except InvalidStatus as exc:
        response = exc.response
        raise _pty.handshake_error(response.status_code, dict(response.headers),
                                   bytes(response.body or b""), label) from None
    except (OSError, TimeoutError) as exc:
        raise APIConnectionError(f"{label}: {type(exc).__name__}: {exc}") from exc


class AsyncPty:
    """One attachment to a terminal (from `sbx.pty.create` or `sbx.pty.connect`).

    Its output comes to `on_data` (given to create/connect; run by a task of its own) or by
    iterating over the handle (`async for`); `wait()` returns the exit code. `disconnect()`
    (or leaving an `async with` block) detaches and leaves the process running; `kill()`
    ends it.
    """

    def __init__(self, sandbox_id: str, pid: int, http: AsyncHTTP, ws: ClientConnection,
                 on_data: AsyncPtyDataCallback | None = None) -> None:
        self._sandbox_id = sandbox_id
        self._pid = pid
        self._http = http
        self._ws = ws
        self._state = _pty.PtyState()
        self._on_data = on_data
        self._detached = False
        self._reader: asyncio.Task[None] | None = None
        if on_data is not None:
            self._reader = asyncio.get_running_loop().create_task(self._read_all())

    def __repr__(self) -> str:
        return f"AsyncPty(sandbox_id={self._sandbox_id!r}, pid={self._pid})"

    @property
    def pid(self) -> int:
        """The terminal's process id in the sandbox (what `connect` takes)."""
        return self._pid

    @property
    def exit_code(self) -> int | None:
        """The process's exit code once it ended (128+N when killed by signal N), else None."""
        return self._state.exit_code

    def _label(self) -> str:
        return f"pty {self._pid} of {self._sandbox_id}"

    async def _next(self) -> bytes | None:
        while not self._state.exited:
            try:
                message = await self._ws.recv()
            except ConnectionClosed as exc:
                if self._state.exited or self._detached:
                    return None  # the end, or this handle's own disconnect()
                rcvd = exc.rcvd
                raise _pty.closed_error(rcvd.code if rcvd else None,
                                        rcvd.reason if rcvd else "", self._label()) from None
            data = self._state.take(message)
            if data is not None:
                return data
        return None

    async def _read_all(self) -> None:
        while (data := await self._next()) is not None:
            assert self._on_data is not None
            result = self._on_data(data)
            if inspect.isawaitable(result):
                await result

    async def output(self) -> AsyncIterator[bytes]:
        """The terminal's output as it comes (recent output first), until the process ends."""
        if self._reader is not None:
            raise InvalidRequestError("this AsyncPty delivers its output to on_data",
                                      status=400, code="bad_request")
        while (data := await self._next()) is not None:
            yield data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.output()

    async def send_stdin(self, data: str | bytes) -> None:
        """Type `data` into the terminal (`"\\x03"` is Ctrl-C)."""
        for chunk in _pty.chunks(_pty.input_bytes(data)):
            try:
                await self._ws.send(chunk)
            except ConnectionClosed:
                raise _pty.closed_error(None, "", self._label()) from None

    async def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size; its foreground program gets SIGWINCH."""
        try:
            await self._ws.send(_pty.resize_message(cols, rows))
        except ConnectionClosed:
            raise _pty.closed_error(None, "", self._label()) from None

    async def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code (output that nobody reads
        meanwhile is dropped). TimeoutError after `timeout` seconds; it keeps running."""
        try:
            async with asyncio.timeout(timeout):
                if self._reader is None:
                    while await self._next() is not None:
                        pass
                else:
                    await asyncio.shield(self._reader)
        except TimeoutError:
            raise TimeoutError(f"{self._label()} still runs after {timeout} s") from None
        if self._state.exit_code is None:  # disconnect() came first
            raise _pty.closed_error(None, "disconnected", self._label())
        return self._state.exit_code

    async def kill(self) -> None:
        """End the process (SIGKILL to its whole tree); `wait()` then returns 137."""
        await self._http.run(_commands.signal_call(self._sandbox_id, self._pid, SIGKILL))

    async def disconnect(self) -> None:
        """Detach: the process runs on (`sbx.pty.connect(pid)` attaches again)."""
        self._detached = True
        await self._ws.close()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader

    async def __aenter__(self) -> AsyncPty:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.disconnect()


class AsyncTerminals(_base.NamespaceBase[AsyncHTTP]):
    """Terminals of one sandbox (`sbx.pty`)."""

    async def create(self, cols: int = wire_pty.DEFAULT_COLS, rows: int = wire_pty.DEFAULT_ROWS,
                     cmd: str | Sequence[str] | None = None,
                     env: Mapping[str, str] | None = None, cwd: str | None = None,
                     user: str | None = None,
                     on_data: AsyncPtyDataCallback | None = None) -> AsyncPty:
        """Start `cmd` (a shell command line or an argv list; default: the user's login
        shell) on a new `cols` x `rows` terminal and attach to it. `env` and `cwd` default to
        the sandbox's, `user` to the template's USER (else root)."""
        _pty.check_dims(cols, rows)
        info = await self._http.run(_pty.create_pty_call(
            self._sandbox_id, cols=cols, rows=rows, cmd=cmd, env=env, cwd=cwd, user=user))
        return await self.connect(info.pid, on_data=on_data)

    async def connect(self, pid: int, on_data: AsyncPtyDataCallback | None = None) -> AsyncPty:
        """Attach to terminal `pid` (also from another process or machine): its recent
        output comes first. NotFoundError if the sandbox has no such terminal."""
        ws = await _open(self._http, self._sandbox_id, pid)
        return AsyncPty(self._sandbox_id, pid, self._http, ws, on_data)
