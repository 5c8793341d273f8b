"""The guest agent: one reader thread, per-op worker threads, one lock around writes.

The reader (the main thread) decodes frames and dispatches them: frames for an op that
is in flight go to that op (credits, stdin, eof, cancel); new requests start a worker
thread. Writes of whole frames happen under one lock and are tagged with the connection
generation: frames of ops from an older connection are dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

from pandastack.guestproto.frames import (
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    ProtocolError,
    encode,
)

from . import __version__, code, execs, files, metrics, pty, search, sysinit, volumes, watch
from .cgroups import Cgroups
from .channel import Channel
from .ops import AgentState, Handler, Op, OpError, oserror_reply
from .procs import ProcessTable

log = logging.getLogger("pandastack_guest")


def _init(agent: AgentState, op: Op, f: Frame) -> None:
    h = f.header
    time_ns, hostname, machine_id = h.get("time_ns"), h.get("hostname"), h.get("machine_id")
    try:
        sysinit.validate(time_ns, hostname, machine_id, f.payload)
    except ValueError as e:
        raise OpError("EINVAL", str(e)) from None
    if agent.guest:
        assert isinstance(time_ns, int) and isinstance(hostname, str)
        assert isinstance(machine_id, str)
        sysinit.apply(time_ns, hostname, machine_id, f.payload)
    op.send("ok", applied=agent.guest)


def _dispatch_table(*tables: dict[str, Handler]) -> dict[str, Handler]:
    merged: dict[str, Handler] = {}
    for table in tables:
        twice = merged.keys() & table.keys()
        if twice:
            raise ValueError(f"requests answered by two modules: {sorted(twice)}")
        merged |= table
    return merged


# Each module names the requests it answers, so a new operation is not named here too.
HANDLERS = _dispatch_table({"init": _init}, execs.HANDLERS, files.HANDLERS, search.HANDLERS,
                           watch.HANDLERS, code.HANDLERS, metrics.HANDLERS, volumes.HANDLERS,
                           pty.HANDLERS)

# Frames that only make sense for an op in flight; late ones are dropped silently.
STREAM_TYPES = frozenset({"credit", "data", "eof", "cancel", "stdin", "stdin_eof", "signal",
                          "resize"})


class Agent:
    procs: ProcessTable
    code_socket: str

    def __init__(self, chan: Channel, *, guest: bool, code_socket: str = code.SOCKET_PATH) -> None:
        self.chan = chan
        self.guest = guest
        self.code_socket = code_socket
        self.gen = 0
        self._wlock = threading.Lock()
        self._ops: dict[int, Op] = {}
        self._ops_lock = threading.Lock()
        # Commands run in /work unless told otherwise: relative paths in user code (the
        # file an analysis writes, say) land next to the files the user uploaded there.
        self.procs = ProcessTable(Cgroups.setup() if guest else None,
                                  default_cwd="/work" if guest else None)

    # -- writing --------------------------------------------------------------------
    def send(self, header: dict[str, Any], payload: bytes, gen: int) -> bool:
        """Write one frame unless ``gen`` is no longer the current connection."""
        try:
            data = encode(header, payload)
        except ProtocolError as e:
            log.error("cannot encode %s: %s", header.get("t"), e)
            return False
        with self._wlock:
            if gen != self.gen:
                return False
            try:
                self.chan.write_all(data)
            except OSError as e:
                log.warning("write failed: %s", e)
                return False
        return True

    def _reply(self, f: Frame, t: str, **fields: Any) -> None:
        self.send({"t": t, "id": f.id, **fields}, b"", self.gen)

    # -- reading --------------------------------------------------------------------
    def run(self) -> int:
        if self.guest:
            # Tell a host that is already connected (to the agent that died before us) that
            # its operations are gone, so it fails them now instead of waiting forever.
            threading.Thread(target=self._announce, name="announce", daemon=True).start()
        dec = FrameDecoder()
        synced = False
        delay = 0.01
        while True:
            data = self.chan.read()
            if not data:
                self._disconnect()
                dec.clear()
                synced = False
                if not self.chan.reconnects:
                    log.info("channel closed; exiting")
                    return 0
                time.sleep(delay)  # no host connected: back off, never busy-spin
                delay = min(delay * 2, 0.2)
                continue
            delay = 0.01
            dec.feed(data)
            while True:
                if not synced:
                    f = dec.scan(lambda fr: fr.t == "hello" and fr.id == 0)
                    if f is None:
                        break
                    synced = self._hello(f)
                    continue
                try:
                    f = dec.next_frame()
                except ProtocolError as e:
                    log.warning("bad frame from host: %s; resyncing", e)
                    self.send(
                        {"t": "error", "id": 0, "code": "EPROTO", "message": str(e)}, b"", self.gen
                    )
                    self._disconnect()
                    dec.skip_bad()
                    synced = False
                    continue
                if f is None:
                    break
                try:
                    self._dispatch(f)
                except Exception:
                    log.exception("dispatching %s", f.t)

    def _announce(self) -> None:
        with contextlib.suppress(OSError):  # no host yet: nothing to tell
            self.send({"t": "started", "id": 0, "pid": os.getpid()}, b"", self.gen)

    def _disconnect(self) -> None:
        """The host went away (or we lost sync): detach every op of this connection."""
        self.gen += 1
        with self._ops_lock:
            ops = list(self._ops.values())
            self._ops.clear()
        for op in ops:
            try:
                op.cancel(explicit=False)
            except Exception:
                log.exception("cancelling op %d", op.id)

    def _hello(self, f: Frame) -> bool:
        v = f.header.get("v")
        nonce = f.header.get("nonce")
        if v != PROTOCOL_VERSION:
            self._reply(
                f,
                "error",
                code="EPROTONOSUPPORT",
                message=f"protocol version {v!r} not supported (want {PROTOCOL_VERSION})",
                nonce=nonce,
            )
            return False
        self._disconnect()
        self._reply(
            f, "hello", v=PROTOCOL_VERSION, nonce=nonce, agent_version=__version__, pid=os.getpid()
        )
        return True

    def _dispatch(self, f: Frame) -> None:
        t = f.t
        if t == "hello":
            self._hello(f)
            return
        with self._ops_lock:
            op = self._ops.get(f.id)
        if op is not None:
            op.on_frame(f)
            return
        if t == "ping":
            self._reply(f, "pong")
            return
        handler = HANDLERS.get(t)
        if handler is None:
            if t not in STREAM_TYPES:
                self._reply(f, "error", code="ENOSYS", message=f"unknown request type {t!r}")
            return
        if f.id == 0:
            self._reply(f, "error", code="EINVAL", message="id 0 is reserved for hello")
            return
        op = Op(f, self.gen, self.send)
        if t == "init":
            # Inline in the reader: it is short, and every request after it in the stream
            # must see the new clock, RNG and identity, so nothing may overtake it.
            self._run_op(op, handler, f)
            return
        op.release = lambda: self._release(op)
        with self._ops_lock:
            self._ops[op.id] = op
        threading.Thread(
            target=self._run_op, args=(op, handler, f), name=f"op-{t}-{f.id}", daemon=True
        ).start()

    def _release(self, op: Op) -> None:
        with self._ops_lock:
            if self._ops.get(op.id) is op:
                del self._ops[op.id]

    def _run_op(self, op: Op, handler: Handler, f: Frame) -> None:
        try:
            handler(self, op, f)
        except OpError as e:
            self._error(op, e)
        except OSError as e:
            self._error(op, oserror_reply(e))
        except Exception as e:
            log.exception("op %s %d failed", op.kind, op.id)
            self._error(op, OpError("EIO", f"{type(e).__name__}: {e}"))
        finally:
            if not op.keep:
                self._release(op)

    def _error(self, op: Op, e: OpError) -> None:
        fields: dict[str, Any] = {"code": e.code, "message": e.message}
        if e.path is not None:
            fields["path"] = e.path
        op.send("error", **fields)
