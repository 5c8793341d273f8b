"""A scripted guest that speaks the real wire protocol to the real AgentClient over a
socketpair: the guest is untrusted, so the tests play it as an attacker (or a broken agent)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterable, Iterator

import pytest

from pandastack.guestproto import frames as P
from pandastack.host.agentlink.client import AgentClient


class FakeGuest:
    """The guest end of a socketpair, driven by the test (blocking socket in a thread)."""

    def __init__(self) -> None:
        self.host_end, self.sock = socket.socketpair()
        self.sock.settimeout(5)
        self.dec = P.FrameDecoder()
        self._send_lock = threading.Lock()

    def recv_frame(self) -> P.Frame:
        while (f := self.dec.next_frame()) is None:
            data = self.sock.recv(65536)
            assert data, "host closed"
            self.dec.feed(data)
        return f

    def recv_until(self, t: str) -> P.Frame:
        """The next frame of type `t`, skipping any other (the host's data, credits...)."""
        while (f := self.recv_frame()).t != t:
            pass
        return f

    def send(self, data: bytes) -> None:
        with self._send_lock:  # whole frames, also when two threads play the guest
            self.sock.sendall(data)

    def send_many(self, data: bytes, count: int) -> None:
        for _ in range(count):
            self.send(data)

    def answer_hello(self, prefix: bytes = b"") -> None:
        f = self.recv_frame()
        assert f.t == "hello" and f.id == 0
        self.send(prefix + P.frame("hello", 0, v=1, nonce=f.header["nonce"], agent_version="f"))

    async def client(self, *, op_timeout: float = 30.0) -> AgentClient:
        t = asyncio.get_running_loop().run_in_executor(None, self.answer_hello)
        c = await AgentClient.from_socket(self.host_end, op_timeout=op_timeout)
        await t
        return c

    def stream(self, op_id: int, frames: Iterable[bytes], credit: int = P.INITIAL_WINDOW) -> str:
        """Send data `frames` (encoded) for `op_id` within the credit the host grants, as an
        honest agent would. Returns "cancelled" if the host cancelled the op, else "done"."""
        for data in frames:
            need = len(data) - P.PREFIX_SIZE - P.parse_prefix(data[: P.PREFIX_SIZE])[0]
            while credit < need:
                f = self.recv_frame()
                if f.id != op_id:
                    continue
                if f.t == "cancel":
                    return "cancelled"
                if f.t == "credit":
                    credit += f.header["n"]
            credit -= need
            self.send(data)
        return "done"

    def close(self) -> None:
        self.sock.close()


async def in_thread(fn: Callable[[], object]) -> object:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


@pytest.fixture
def fake() -> Iterator[FakeGuest]:
    """A FakeGuest for the test, closed after it (tests/host/agentlink/conftest.py offers it
    there; a module elsewhere imports it)."""
    g = FakeGuest()
    yield g
    g.close()


@contextlib.contextmanager
def traced_peak() -> Iterator[Callable[[], int]]:
    """Python heap bytes allocated at the peak of the block, over what was live at its start
    (the fake guest's thread is traced too: it keeps its own allocations small)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield lambda: tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
