"""One in-flight operation on the agent side, and request-argument helpers."""

from __future__ import annotations

import errno
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pandastack.guestproto.frames import CREDIT_BATCH, INITIAL_WINDOW, MAX_CHUNK, Frame

from .flow import Credit, Grant

if TYPE_CHECKING:
    from .procs import ProcessTable


class OpError(Exception):
    """Answer the operation with ``error{code, message, path?}``."""

    def __init__(self, code: str, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path


def oserror_reply(e: OSError) -> OpError:
    code = errno.errorcode.get(e.errno or 0, "EIO")
    path = e.filename if isinstance(e.filename, str) else None
    return OpError(code, e.strerror or str(e), path)


Send = Callable[[dict[str, Any], bytes, int], bool]


class AgentState(Protocol):
    """What of the agent a handler may use."""

    procs: ProcessTable
    code_socket: str
    guest: bool


#: Runs one request (its first frame) on its own worker thread.
Handler = Callable[[AgentState, "Op", Frame], None]


class Op:
    """State shared by an op's worker thread and the reader thread.

    The reader thread only calls ``on_frame``/``cancel`` (never blocking); the worker
    sends frames with ``send`` and data with ``send_data`` (which honours credits).
    """

    def __init__(self, frame: Frame, gen: int, send: Send) -> None:
        self.id = frame.id
        self.kind = frame.t
        self.gen = gen
        self._send = send
        self.credit = Credit(INITIAL_WINDOW)
        self.grant = Grant(CREDIT_BATCH)
        self.inbox: queue.SimpleQueue[Frame | None] = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self.explicit_cancel = False
        self._lock = threading.Lock()
        self._on_cancel: Callable[[Op], None] | None = None
        self._on_stream_frame: Callable[[Frame], None] | None = None
        self.keep = False
        """Set by a handler whose op outlives it (released later by ``release``)."""
        self.release: Callable[[], None] = lambda: None

    def send(self, t: str, payload: bytes = b"", **fields: Any) -> bool:
        return self._send({"t": t, "id": self.id, **fields}, payload, self.gen)

    def send_data(self, t: str, data: bytes) -> bool:
        """Send ``data`` as ``t`` frames, waiting for credit. False if cancelled."""
        view = memoryview(data)
        while view:
            n = self.credit.take(min(len(view), MAX_CHUNK))
            if n == 0 or self.cancelled.is_set():
                return False
            if not self.send(t, bytes(view[:n])):
                return False
            view = view[n:]
        return True

    def consumed(self, n: int, *, flush: bool = False) -> None:
        """We consumed ``n`` bytes the host sent on this op: grant credit back."""
        g = self.grant.consumed(n, flush=flush)
        if g:
            self.send("credit", n=g)

    def cancel(self, *, explicit: bool) -> None:
        with self._lock:
            if self.cancelled.is_set():
                return
            self.explicit_cancel = explicit
            self.cancelled.set()
            cb = self._on_cancel
        self.credit.close()
        self.inbox.put(None)
        if cb is not None:
            cb(self)

    def set_handlers(
        self, on_stream_frame: Callable[[Frame], None], on_cancel: Callable[[Op], None]
    ) -> None:
        """Route this op's stream frames to ``on_stream_frame`` from now on (frames that
        arrived before are replayed to it) and call ``on_cancel`` on cancellation (at
        once if it already happened)."""
        with self._lock:
            self._on_stream_frame = on_stream_frame
            self._on_cancel = on_cancel
            early: list[Frame] = []
            while not self.inbox.empty():
                f = self.inbox.get()
                if f is not None:
                    early.append(f)
            for f in early:
                on_stream_frame(f)
            cancelled = self.cancelled.is_set()
        if cancelled:
            on_cancel(self)

    def on_frame(self, f: Frame) -> None:
        """A stream frame from the host for this op (reader thread; must not block)."""
        if f.t == "credit":
            n = f.header.get("n")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self.credit.add(n)
        elif f.t == "cancel":
            self.cancel(explicit=True)
        else:
            with self._lock:
                if self._on_stream_frame is not None:
                    self._on_stream_frame(f)
                else:
                    self.inbox.put(f)


# -- argument helpers ---------------------------------------------------------------


def arg_str(h: dict[str, Any], key: str, default: str | None = None) -> str:
    v = h.get(key, default)
    if not isinstance(v, str) or (not v and key in ("path", "src", "dst")):
        raise OpError("EINVAL", f"'{key}' must be a non-empty string")
    if "\0" in v:
        raise OpError("EINVAL", f"'{key}' contains NUL")
    return v


def arg_opt_str(h: dict[str, Any], key: str) -> str | None:
    if h.get(key) is None:
        return None
    return arg_str(h, key)


def arg_int(h: dict[str, Any], key: str, default: int | None = None, *, lo: int = 0) -> int:
    v = h.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise OpError("EINVAL", f"'{key}' must be an int >= {lo}")
    return v


def arg_opt_int(h: dict[str, Any], key: str, *, lo: int = 0) -> int | None:
    if h.get(key) is None:
        return None
    return arg_int(h, key, lo=lo)


def arg_bool(h: dict[str, Any], key: str, default: bool = False) -> bool:
    v = h.get(key, default)
    if not isinstance(v, bool):
        raise OpError("EINVAL", f"'{key}' must be a bool")
    return v
