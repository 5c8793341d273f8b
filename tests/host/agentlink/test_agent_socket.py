"""Connections to a VM's agent socket as QEMU serves it: its chardev socket server listens with
a backlog of 1, serves one connection at a time, accepts the next only once that one hangs up,
and reads from it only what the guest takes (nothing before the agent opens its port). A real
listening socket plays QEMU, and the real reference agent (--fd test mode) answers where a
test needs an answer. No VM needed.

Seen in CI under load: a template build's boot failed for 240 s with "handshake failed:
Connection lost". Its 5 s attempts timed out before the agent was up; each had written the
handshake's 1 MiB padding, which a transport's close() kept trying to write, so the socket
stayed open and QEMU kept serving it; later attempts filled the backlog, and asyncio took the
EAGAIN of a full backlog for a connect in progress and wrote to a socket that was not
connected."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.host.agentlink import channel, handshake
from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import AgentConnectionError
from tests.host.agentlink.test_agent_client import SRC

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def vmm_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    """A listening socket as QEMU's `-chardev socket,server=on,wait=off` makes it."""
    path = tmp_path / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    yield server, path
    server.close()


def _fill_backlog(path: Path) -> list[socket.socket]:
    """Connections queued until the listener takes no more (a QEMU busy with another)."""
    queued: list[socket.socket] = []
    for _ in range(8):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except BlockingIOError:
            sock.close()
            return queued
        queued.append(sock)
    pytest.fail("the listener's backlog never filled")


def _hung_up(sock: socket.socket, timeout_ms: int) -> bool:
    poll = select.poll()
    poll.register(sock, select.POLLHUP)
    return any(events & select.POLLHUP for _, events in poll.poll(timeout_ms))


async def test_a_timed_out_handshake_hangs_up_at_once(
        vmm_socket: tuple[socket.socket, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The guest reads nothing yet: the attempt times out after its padding, and its socket
    must be closed then, or QEMU would serve it (and nothing else) forever."""
    server, path = vmm_socket
    monkeypatch.setattr(handshake, "HELLO_RETRY", 0.05)  # pad at once: 1 MiB left unwritten
    with pytest.raises(AgentConnectionError, match="no hello reply"):
        await AgentClient.connect(path, timeout=0.3)
    held, _ = server.accept()
    try:
        assert await asyncio.to_thread(_hung_up, held, 5000), \
            "the timed-out attempt left its socket open"
    finally:
        held.close()


async def test_a_busy_socket_is_waited_for_then_refused_as_busy(
        vmm_socket: tuple[socket.socket, Path]) -> None:
    _, path = vmm_socket
    queued = _fill_backlog(path)
    try:
        started = time.monotonic()
        with pytest.raises(AgentConnectionError, match=channel.BUSY):
            await AgentClient.connect(path, timeout=0.3)
        assert time.monotonic() - started >= 0.25  # it waited, not failed at once
    finally:
        for sock in queued:
            sock.close()


async def test_a_connect_waiting_on_a_busy_socket_gets_through_when_it_frees(
        vmm_socket: tuple[socket.socket, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the connection QEMU served hangs up, the one waiting reaches the agent."""
    server, path = vmm_socket
    queued = _fill_backlog(path)
    busy = asyncio.Event()
    connect = channel._connect_unix

    def spy(where: str) -> socket.socket:
        try:
            return connect(where)
        except BlockingIOError:
            busy.set()
            raise

    monkeypatch.setattr(channel, "_connect_unix", spy)
    task = asyncio.create_task(AgentClient.connect(path, timeout=20))
    await asyncio.wait_for(busy.wait(), 10)
    for sock in queued:
        sock.close()

    def next_live() -> socket.socket:
        # QEMU takes the queued connections in turn; the ones already gone end at once.
        server.settimeout(10)
        while True:
            conn, _ = server.accept()
            if not _hung_up(conn, 0):
                return conn
            conn.close()

    conn = await asyncio.to_thread(next_live)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    agent = subprocess.Popen([sys.executable, "-m", "pandastack.guest", "--fd",
                              str(conn.fileno())], pass_fds=[conn.fileno()], env=env)
    conn.close()
    try:
        client = await task
        try:
            assert await client.ping() >= 0
        finally:
            await client.close()
    finally:
        try:
            agent.wait(5)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
