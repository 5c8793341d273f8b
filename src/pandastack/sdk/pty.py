"""`sbx.pty`: terminals (sync twins; `async_pty.py` has the async ones). A terminal is a
process on a pseudo-terminal in the sandbox, reached over one WebSocket (`wire_pty`)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.uri import parse_uri

from pandastack.sdk import _base, _commands, _pty
from pandastack.sdk._http import HTTP
from pandastack.sdk._pty import PtyDataCallback
from pandastack.sdk._tls_socket import LockedTLSSocket
from pandastack.sdk.errors import APIConnectionError, InvalidRequestError
from pandastack.wire import pty as wire_pty

try:
    from websockets.proxy import get_proxy
except ImportError:  # websockets < 15.1 kept it beside the URI parser
    from websockets.uri import get_proxy  # type: ignore[attr-defined,no-redef]

__all__ = ["Pty", "Terminals"]

SIGKILL = 9


def _tls_socket(url: str, context: ssl.SSLContext, timeout: float) -> LockedTLSSocket | None:
    """The TLS connection of a `wss://` URL as a socket both of websockets' threads may use
    (`_tls_socket`'s module says why); None where a proxy is configured for it (websockets
    then connects through the proxy itself)."""
    uri = parse_uri(url)
    if get_proxy(uri) is not None:
        return None
    raw = socket.create_connection((uri.host, uri.port), timeout=timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        return LockedTLSSocket(raw, context, uri.host, timeout)
    except BaseException:
        raw.close()
        raise


def _open(http: HTTP, sandbox_id: str, pid: int) -> ClientConnection:
    label = f"pty {pid} of {sandbox_id}"
    url = _pty.ws_url(http.config, sandbox_id, pid)
    timeout = http.timeout.connect or 30
    deadline = time.monotonic() + timeout
    options: dict[str, Any] = {"additional_headers": _pty.ws_headers(http.config),
                               "max_size": _pty.MAX_MESSAGE, "compression": None}
    ws: ClientConnection
    try:
        context = _pty.ws_ssl(http.config)
        sock = None if context is None else _tls_socket(url, context, timeout)
        if sock is not None:
            # TLS is done: websockets speaks plain WebSocket over it (same Host header).
            ws = connect("ws" + url.removeprefix("wss"), sock=cast(socket.socket, sock),
                         open_timeout=max(0.1, deadline - time.monotonic()), **options)
        else:
            ws = connect(url, ssl=context, open_timeout=timeout, **options)
    except InvalidStatus as exc:
        response = exc.response
        raise _pty.handshake_error(response.status_code, dict(response.headers),
                                   bytes(response.body or b""), label) from None
    except (OSError, TimeoutError) as exc:
        raise APIConnectionError(f"{label}: {type(exc).__name__}: {exc}") from exc
    # The handle outlives this call, so no `with connect(...)`: entering the connection's
    # own context is what websockets (>= 17.1) asks of a connection used without one.
    return ws.__enter__()


class Pty:
    """One attachment to a terminal (from `sbx.pty.create` or `sbx.pty.connect`).

    Its output comes to `on_data` (given to create/connect; called from a thread of its own)
    or by iterating over the handle; `wait()` returns the exit code. `disconnect()` (or
    leaving a `with` block) detaches and leaves the process running; `kill()` ends it.
    """

    def __init__(self, sandbox_id: str, pid: int, http: HTTP, ws: ClientConnection,
                 on_data: PtyDataCallback | None = None) -> None:
        self._sandbox_id = sandbox_id
        self._pid = pid
        self._http = http
        self._ws = ws
        self._state = _pty.PtyState()
        self._on_data = on_data
        self._detached = False
        self._done = threading.Event()
        self._failure: BaseException | None = None
        self._reader: threading.Thread | None = None
        if on_data is not None:
            self._reader = threading.Thread(target=self._read_all, name=f"pty-{pid}",
                                            daemon=True)
            self._reader.start()

    def __repr__(self) -> str:
        return f"Pty(sandbox_id={self._sandbox_id!r}, pid={self._pid})"

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

    def _next(self, deadline: float | None = None) -> bytes | None:
        """The next output (None once the exit came); TimeoutError past `deadline`."""
        while not self._state.exited:
            try:
                message = self._ws.recv(None if deadline is None
                                        else max(0.0, deadline - time.monotonic()))
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

    def _read_all(self) -> None:
        try:
            while (data := self._next()) is not None:
                assert self._on_data is not None
                self._on_data(data)
        except BaseException as exc:  # handed to wait()
            self._failure = exc
        finally:
            self._done.set()

    def output(self) -> Iterator[bytes]:
        """The terminal's output as it comes (recent output first), until the process ends."""
        if self._reader is not None:
            raise InvalidRequestError("this Pty delivers its output to on_data", status=400,
                                      code="bad_request")
        while (data := self._next()) is not None:
            yield data

    def __iter__(self) -> Iterator[bytes]:
        return self.output()

    def send_stdin(self, data: str | bytes) -> None:
        """Type `data` into the terminal (`"\\x03"` is Ctrl-C)."""
        for chunk in _pty.chunks(_pty.input_bytes(data)):
            try:
                self._ws.send(chunk)
            except ConnectionClosed:
                raise _pty.closed_error(None, "", self._label()) from None

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size; its foreground program gets SIGWINCH."""
        try:
            self._ws.send(_pty.resize_message(cols, rows))
        except ConnectionClosed:
            raise _pty.closed_error(None, "", self._label()) from None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code (output that nobody reads
        meanwhile is dropped). TimeoutError after `timeout` seconds; it keeps running."""
        if self._reader is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while self._next(deadline) is not None:
                    pass
            except TimeoutError:
                raise TimeoutError(f"{self._label()} still runs after {timeout} s") from None
        elif not self._done.wait(timeout):
            raise TimeoutError(f"{self._label()} still runs after {timeout} s")
        if self._failure is not None:
            raise self._failure
        if self._state.exit_code is None:  # disconnect() came first
            raise _pty.closed_error(None, "disconnected", self._label())
        return self._state.exit_code

    def kill(self) -> None:
        """End the process (SIGKILL to its whole tree); `wait()` then returns 137."""
        self._http.run(_commands.signal_call(self._sandbox_id, self._pid, SIGKILL))

    def disconnect(self) -> None:
        """Detach: the process runs on (`sbx.pty.connect(pid)` attaches again)."""
        self._detached = True
        self._ws.close()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(10)

    def __enter__(self) -> Pty:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.disconnect()


class Terminals(_base.NamespaceBase[HTTP]):
    """Terminals of one sandbox (`sbx.pty`)."""

    def create(self, cols: int = wire_pty.DEFAULT_COLS, rows: int = wire_pty.DEFAULT_ROWS,
               cmd: str | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
               cwd: str | None = None, user: str | None = None,
               on_data: PtyDataCallback | None = None) -> Pty:
        """Start `cmd` (a shell command line or an argv list; default: the user's login
        shell) on a new `cols` x `rows` terminal and attach to it. `env` and `cwd` default to
        the sandbox's, `user` to the template's USER (else root)."""
        _pty.check_dims(cols, rows)
        info = self._http.run(_pty.create_pty_call(self._sandbox_id, cols=cols, rows=rows,
                                                   cmd=cmd, env=env, cwd=cwd, user=user))
        return self.connect(info.pid, on_data=on_data)

    def connect(self, pid: int, on_data: PtyDataCallback | None = None) -> Pty:
        """Attach to terminal `pid` (also from another process or machine): its recent
        output comes first. NotFoundError if the sandbox has no such terminal."""
        return Pty(self._sandbox_id, pid, self._http, _open(self._http, self._sandbox_id, pid),
                   on_data)
