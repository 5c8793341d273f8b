"""Async client of the in-guest agent (protocol: spec/guest-protocol.md).

One ``AgentClient`` owns one byte-stream connection (the unix socket QEMU serves for the
VM's virtio-serial port). A reader task decodes frames and routes them to per-operation
queues; frames are written whole under a lock. Many operations may run at once.

Every wait on the guest is bounded: ``op_timeout`` (default 30 s) for ordinary calls and
for each step of a file transfer; an exec with a ``timeout`` waits at most that timeout
plus ``op_timeout``. Expiry raises AgentConnectionError. An invalid frame from the guest
fails every pending operation with AgentProtocolError and marks the client ``broken``; so
does anything else that stops the reader task (as AgentConnectionError).

The guest is untrusted: everything it can make the host hold is bounded. Data streams by
their credit window; the frames queued for one operation by MAX_OP_BUFFER; what an operation
collects (a listing, a process list, a file read whole) by its own limit. Crossing a bound
fails that operation with AgentLimitError and drops what it held; the channel stays usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any, Self

from pandastack.guestproto import frames as P
from pandastack.guestproto.ops import (
    DATA_REPLIES,
    FINAL_REPLIES,
    REPLY_KINDS,
    check_request,
    reply_of,
)
from pandastack.host.agentlink.failures import note_failure
from pandastack.host.agentlink.handshake import READ_SIZE, InitParams, handshake
from pandastack.hostport.errors import (
    AgentConnectionError,
    AgentError,
    AgentLimitError,
    AgentProtocolError,
    GuestOSError,
)

log = logging.getLogger(__name__)

DEFAULT_OP_TIMEOUT = 30.0
# An operation without a deadline (a long exec, a wait) checks that the agent still answers
# this often, so a guest that froze fails the call instead of hanging it forever.
LIVENESS_INTERVAL = 20.0
MAX_OP_BUFFER = 16 * 2**20
"""What the frames queued for one operation (received, not yet taken) may cost, counted as
payload + HEADER_COST x header + FRAME_COST each. An honest agent stays far below: data is
held to the credit window (1 MiB) and every other reply comes once, or (``entries``) is read
as fast as it arrives. Crossing it abandons the operation (AgentLimitError)."""
HEADER_COST = 32
"""A parsed header can take ~24x its JSON bytes (measured: ``[{},{},...]``)."""
FRAME_COST = 512
"""The objects of one queued frame beyond its bytes, so empty frames are counted too."""
MAX_ERROR_TEXT = 4096
"""Characters kept of an ``error`` frame's message and path."""


BUSY = "its listen backlog is full"


def _connect_unix(path: str) -> socket.socket:
    """A connected socket, or BlockingIOError when the listener's backlog is full (QEMU's
    chardev listens with a backlog of 1 and accepts nothing while it serves a connection).
    asyncio's own connect takes that EAGAIN for a connect in progress and hands back a
    socket that is not connected, whose first write then fails as "Connection lost"."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect(path)  # AF_UNIX: done at once, or refused; never in progress
    except BaseException:
        sock.close()
        raise
    return sock


class Op:
    """Host-side state of one operation id."""

    def __init__(self, op_id: int, kind: str) -> None:
        self.id = op_id
        self.kind = kind
        self.queue: asyncio.Queue[P.Frame | BaseException] = asyncio.Queue()
        self.wake = asyncio.Event()
        self.send_credit = P.INITIAL_WINDOW  # bytes we may still send on this id
        self.recv_window = P.INITIAL_WINDOW  # bytes the agent may still send us
        self.ungranted = 0  # consumed bytes not yet granted back
        self.buffered = 0  # data bytes sitting in ``queue``
        self.cost = 0  # what the frames in ``queue`` cost (see MAX_OP_BUFFER)
        self.ended = False  # a final frame (or failure) arrived
        self.finished = False  # its caller read its final frame: no `cancel` is due


class AgentChannel:
    """One connection to the agent: the handshake (handshake.py), the reader task that routes
    frames to per-operation queues, credits, and requests (`_request`, `_call` for those with
    one reply; both checked against the table of guest operations). The operations are in
    `AgentClient` (client.py) and its mixins (files.py, code.py, ...)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.op_timeout = op_timeout
        self.liveness_interval = LIVENESS_INTERVAL
        self._decoder = P.FrameDecoder()
        self._wlock = asyncio.Lock()
        self._ops: dict[int, Op] = {}
        self._next_id = 1
        self._broken: AgentError | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[None]] = set()
        self.agent_version: str | None = None
        self.guest_protocol: int | None = None  # agreed at the handshake
        self.agent_pid: int | None = None

    # -- connecting -----------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        socket_path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
    ) -> Self:
        """Connect to the unix socket (waiting for it to appear) and do the handshake."""
        path = os.fspath(socket_path)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                sock = _connect_unix(path)
                break
            except (FileNotFoundError, ConnectionRefusedError, BlockingIOError) as e:
                if time.monotonic() + delay >= deadline:
                    why = (f"{BUSY} (another connection holds it)"
                           if isinstance(e, BlockingIOError) else str(e))
                    raise AgentConnectionError(f"cannot connect to {path}: {why}") from e
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)
            except OSError as e:
                raise AgentConnectionError(f"cannot connect to {path}: {e}") from e
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        client = cls(reader, writer, op_timeout=op_timeout)
        await client._start(max(0.0, deadline - time.monotonic()))
        return client

    @classmethod
    async def from_socket(
        cls,
        sock: socket.socket,
        *,
        timeout: float = 10.0,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        init: InitParams | None = None,
    ) -> Self:
        """Use an already-connected stream socket.

        With ``init``, the ``init`` request is written in the same write as the hello, so a
        freshly restored guest handles both in one wake-up (the create path); the call
        returns once the agent has applied it.
        """
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        client = cls(reader, writer, op_timeout=op_timeout)
        await client._start(timeout, init)
        return client

    async def _start(self, timeout: float, init: InitParams | None = None) -> None:
        init_op: Op | None = None
        preamble = b""
        if init is not None:
            init_op = self._register("init")
            preamble = init.frame(init_op.id)
        try:
            async with asyncio.timeout(timeout):
                hello = await handshake(self._reader, self._write_raw, self._decoder, preamble)
        except TimeoutError:
            self._close_transport()
            raise AgentConnectionError(f"no hello reply from agent within {timeout:.1f}s") from None
        except (OSError, AgentError) as e:
            self._close_transport()
            if isinstance(e, AgentError):
                raise
            raise AgentConnectionError(f"handshake failed: {e}") from e
        self.agent_version, self.agent_pid = hello.agent_version, hello.pid
        self.guest_protocol = hello.protocol
        self._reader_task = asyncio.create_task(self._read_loop(), name="agent-reader")
        if init_op is not None:
            try:
                f = await self._next(init_op, self.op_timeout)
                if f.t != "ok":
                    raise self._protocol_error(f"init: expected 'ok', got {f.t!r}")
            except BaseException:
                await self.close()
                raise
            finally:
                self._unregister(init_op)

    async def _write_raw(self, data: bytes) -> None:
        async with self._wlock:
            self._writer.write(data)
            await self._writer.drain()

    # -- state ------------------------------------------------------------------------
    @property
    def broken(self) -> bool:
        return self._broken is not None

    def _err(self) -> AgentError:
        b = self._broken
        assert b is not None
        e = type(b)(*b.args)
        e.__cause__ = b
        return e

    def _fail(self, exc: AgentError, *, flush: bool = False) -> None:
        if self._broken is not None:
            return
        self._broken = exc
        for op in self._ops.values():
            op.ended = True
            op.queue.put_nowait(exc)
            op.wake.set()
        self._close_transport(flush=flush)

    def _protocol_error(self, msg: str) -> AgentProtocolError:
        exc = AgentProtocolError(msg)
        self._fail(exc)
        return exc

    def _close_transport(self, *, flush: bool = False) -> None:
        """Close the socket; at once unless `flush`. A transport's close() keeps the socket
        open until it has written what it holds, which is never while the guest reads nothing
        (a boot before the agent opens its port, a stuck agent): the handshake's padding
        alone is 1 MiB. QEMU's chardev serves one connection at a time and accepts no other
        until this one hangs up, so a socket left open so wedged every later connection to
        the VM (a build's boot failed for 240 s so, with "Connection lost")."""
        with contextlib.suppress(Exception):
            if flush:
                self._writer.close()
            else:
                self._writer.transport.abort()

    async def close(self) -> None:
        # Frames already written (a cancel) may still go out, for a second at most.
        self._fail(AgentConnectionError("client closed"), flush=True)
        task = self._reader_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for t in list(self._bg):
            t.cancel()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()
        self._close_transport()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- reading ----------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                while (f := self._decoder.next_frame()) is not None:
                    self._dispatch(f)
                data = await self._reader.read(READ_SIZE)
                if not data:
                    raise AgentConnectionError("agent channel closed")
                self._decoder.feed(data)
        except P.ProtocolError as e:
            note_failure("protocol")
            self._fail(AgentProtocolError(f"invalid frame from agent: {e}"))
        except AgentError as e:
            note_failure("closed")
            self._fail(e)
        except OSError as e:
            note_failure("closed")
            self._fail(AgentConnectionError(f"agent channel failed: {e}"))
        except asyncio.CancelledError:
            self._fail(AgentConnectionError("client closed"))
            raise
        except BaseException as e:
            # A bug, or an input nobody foresaw: the reader is gone, so every pending and
            # later operation must fail now rather than wait for a reply that cannot come.
            log.exception("agent channel reader failed")
            self._fail(AgentConnectionError(
                f"the agent channel's reader failed: {type(e).__name__}: {e}"))
            if not isinstance(e, Exception):
                raise

    def _dispatch(self, f: P.Frame) -> None:
        t = f.t
        if f.id == 0:
            if t == "hello":
                return  # a late duplicate answer to our own hello
            if t == "started":
                raise AgentConnectionError("the guest agent restarted; its operations are lost")
            if t == "error":
                raise AgentProtocolError(f"agent lost sync: {f.header.get('message')}")
            raise AgentProtocolError(f"unexpected {t!r} frame on id 0")
        if t not in REPLY_KINDS:
            raise AgentProtocolError(f"unknown frame type {t!r} from agent")
        op = self._ops.get(f.id)
        if op is None or op.ended:
            return  # late frame of an operation we gave up on, or after its last reply
        if t == "credit":
            n = f.header.get("n")
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                raise AgentProtocolError("credit frame without a positive int 'n'")
            op.send_credit += n
            op.wake.set()
            return
        if t in DATA_REPLIES:
            if len(f.payload) > P.MAX_CHUNK:
                raise AgentProtocolError(f"{t} chunk of {len(f.payload)} bytes > {P.MAX_CHUNK}")
            op.recv_window -= len(f.payload)
            if op.recv_window < 0:
                raise AgentProtocolError(f"agent overran the credit window on op {op.id}")
        cost = _cost(f)
        if op.cost + cost > MAX_OP_BUFFER:
            self._abandon(op, AgentLimitError(
                f"{op.kind}: the agent sent more than the host holds for one operation "
                f"({MAX_OP_BUFFER >> 20} MiB of frames not yet read); the operation was "
                "abandoned"))
            return
        op.cost += cost
        if t in DATA_REPLIES:
            op.buffered += len(f.payload)
        elif t in FINAL_REPLIES or (t == "entries" and not f.header.get("more")):
            op.ended = True
        op.queue.put_nowait(f)
        op.wake.set()

    def _abandon(self, op: Op, exc: AgentError) -> None:
        """Fail one operation: drop what it has queued (freeing it), let its caller raise
        ``exc``, ignore what the agent still sends for it, and tell the agent to stop."""
        while not op.queue.empty():
            op.queue.get_nowait()
        op.buffered = op.cost = 0
        op.ended = True
        op.queue.put_nowait(exc)
        op.wake.set()
        self._cancel_soon(op)

    # -- operation plumbing -------------------------------------------------------------
    def _register(self, kind: str) -> Op:
        if self._broken is not None:
            raise self._err()
        op = Op(self._next_id, kind)
        self._next_id += 1
        self._ops[op.id] = op
        return op

    def _unregister(self, op: Op) -> None:
        self._ops.pop(op.id, None)

    @contextlib.contextmanager
    def _operation(self, kind: str) -> Iterator[Op]:
        """An operation's id for the length of the block. Leaving it forgets the id; unless
        the block set ``op.finished`` (its final frame was read), the agent is also told to
        drop the operation: an error, a timeout, a cancelled or closed caller (a stream's
        consumer that stops early) all end it in the guest too."""
        op = self._register(kind)
        try:
            yield op
        finally:
            self._forget(op, cancel=not op.finished)

    def _forget(self, op: Op, *, cancel: bool) -> None:
        """Forget ``op``'s id (frames still arriving on it are dropped); ``cancel``: tell the
        agent to drop the operation too. An operation that outlives one block (a terminal's
        session) ends here."""
        self._unregister(op)
        if cancel:
            self._cancel_soon(op)

    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if self._broken is not None:
            raise self._err()
        data = P.encode(header, payload)
        try:
            async with self._wlock:
                self._writer.write(data)
                async with asyncio.timeout(self.op_timeout):
                    await self._writer.drain()
        except TimeoutError:
            note_failure("timeout")
            exc: AgentError = AgentConnectionError("agent is not reading (write timed out)")
            self._fail(exc)
            raise exc from None
        except (OSError, RuntimeError) as e:
            exc = AgentConnectionError(f"agent channel failed: {e}")
            self._fail(exc)
            raise exc from e

    def _cancel_soon(self, op: Op) -> None:
        """Tell the agent to drop ``op`` (fire and forget)."""
        if self._broken is not None:
            return

        async def send() -> None:
            with contextlib.suppress(AgentError):
                await self._send({"t": "cancel", "id": op.id})

        task = asyncio.get_running_loop().create_task(send())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _next_alive(self, op: Op) -> P.Frame | BaseException:
        while True:
            try:
                async with asyncio.timeout(self.liveness_interval):
                    return await op.queue.get()
            except TimeoutError:
                pass
            if self._broken is not None:
                raise self._err()
            try:
                await self.ping()
            except AgentConnectionError as exc:
                self._fail(AgentConnectionError(f"the agent stopped answering: {exc}"))
                raise self._err() from None

    async def _next(self, op: Op, timeout: float | None) -> P.Frame:
        """Next frame for ``op``; GuestOSError for ``error`` frames.

        Once the connection is broken every pending operation fails at once, even if
        frames are still queued for it.
        """
        if self._broken is not None:
            raise self._err()
        try:
            if timeout is None:
                item = await self._next_alive(op)
            else:
                async with asyncio.timeout(max(0.0, timeout)):
                    item = await op.queue.get()
        except TimeoutError:
            note_failure("timeout")
            raise AgentConnectionError(
                f"{op.kind}: no answer from the agent within {timeout:.1f}s"
            ) from None
        if isinstance(item, BaseException):
            op.queue.put_nowait(item)
            raise self._err() if self._broken is not None else item
        op.cost -= _cost(item)
        if item.t in DATA_REPLIES:
            op.buffered -= len(item.payload)
        if item.t == "error":
            h = item.header
            code, msg, path = h.get("code"), h.get("message"), h.get("path")
            raise GuestOSError(
                code[:64] if isinstance(code, str) else "EIO",
                msg[:MAX_ERROR_TEXT] if isinstance(msg, str) else "",
                path[:MAX_ERROR_TEXT] if isinstance(path, str) else None,
            )
        return item

    async def _consumed(self, op: Op, n: int) -> None:
        op.ungranted += n
        if op.ungranted >= P.CREDIT_BATCH and self._broken is None:
            g, op.ungranted = op.ungranted, 0
            op.recv_window += g
            await self._send({"t": "credit", "id": op.id, "n": g})

    async def ping(self) -> float:
        """Round trip in milliseconds (also how a long wait checks the agent is alive)."""
        t0 = time.perf_counter()
        await self._call("ping")
        return (time.perf_counter() - t0) * 1000

    async def _request(self, op: Op, fields: dict[str, Any], payload: bytes = b"") -> None:
        """Send the request that opens ``op`` (its kind is the request type)."""
        check_request(op.kind, fields)
        await self._send({"t": op.kind, "id": op.id, **fields}, payload)

    async def _call(self, t: str, payload: bytes = b"", **fields: Any) -> P.Frame:
        """A request with one reply (the table's) besides `error`."""
        check_request(t, fields)
        expect = reply_of(t)
        op = self._register(t)
        try:
            await self._send({"t": t, "id": op.id, **fields}, payload)
            f = await self._next(op, self.op_timeout)
            if f.t != expect:
                raise self._protocol_error(f"{t}: expected {expect!r}, got {f.t!r}")
            return f
        finally:
            self._unregister(op)

    def _json_list(self, f: P.Frame, where: str) -> list[Any]:
        try:
            items = P.parse_json(f.payload)
        except ValueError:
            raise self._protocol_error(f"{where}: {f.t} payload is not JSON") from None
        if not isinstance(items, list):
            raise self._protocol_error(f"{where}: {f.t} payload is not a list")
        return items

    def _field(self, f: P.Frame, key: str, typ: type | tuple[type, ...]) -> Any:
        v = f.header.get(key)
        if not isinstance(v, typ) or (isinstance(v, bool) and typ in (int, float, (int, float))):
            raise self._protocol_error(f"{f.t} frame: bad or missing {key!r}")
        return v

    async def _send_stream(
        self,
        op: Op,
        data: bytes | AsyncIterable[bytes],
        t_data: str,
        t_eof: str,
        *,
        credit_timeout: float | None,
    ) -> int:
        """Stream ``data`` on ``op`` honouring credits, then ``t_eof``. Returns bytes sent
        (stops early, without eof, if the operation ended)."""
        sent = 0

        async def chunks() -> AsyncIterator[bytes]:
            if isinstance(data, bytes | bytearray | memoryview):
                yield bytes(data)
            else:
                async for c in data:
                    if not isinstance(c, bytes | bytearray | memoryview):
                        raise TypeError("write_file data must yield bytes")
                    yield bytes(c)

        async for chunk in chunks():
            view = memoryview(chunk)
            while view:
                while op.send_credit <= 0:
                    if op.ended:
                        return sent
                    op.wake.clear()
                    try:
                        if credit_timeout is None:
                            await op.wake.wait()
                        else:
                            async with asyncio.timeout(credit_timeout):
                                await op.wake.wait()
                    except TimeoutError:
                        raise AgentConnectionError(
                            f"{op.kind}: agent granted no credit within {credit_timeout:.1f}s"
                        ) from None
                if op.ended:
                    return sent
                n = min(len(view), P.MAX_CHUNK, op.send_credit)
                op.send_credit -= n
                await self._send({"t": t_data, "id": op.id}, bytes(view[:n]))
                sent += n
                view = view[n:]
        if not op.ended:
            await self._send({"t": t_eof, "id": op.id})
        return sent

    # -- introspection (tests) ------------------------------------------------------------
    def _buffered_bytes(self) -> int:
        """Data bytes received but not yet consumed, over all operations."""
        return sum(op.buffered for op in self._ops.values())


def _cost(f: P.Frame) -> int:
    """What holding frame ``f`` in a queue costs, for MAX_OP_BUFFER."""
    return FRAME_COST + HEADER_COST * f.header_size + len(f.payload)
