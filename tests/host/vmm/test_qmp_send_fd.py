"""A descriptor handed to QEMU over QMP's unix socket (host/vmm/qemu/qmp.py `send_fd_on`)
arrives whatever the event loop: asyncio's, and uvloop's (uvicorn's default where it is
installed), whose transport socket has no `._sock` for qemu.qmp's own `send_fd_scm`."""

from __future__ import annotations

import array
import asyncio
import importlib
import os
import socket
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from pandastack.host.vmm.qemu.qmp import send_fd_on


def loops() -> list[Any]:
    factories: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        factories.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip("no uvloop")))
    else:
        factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


def received_fd(peer: socket.socket) -> int:
    fds = array.array("i")
    data, ancillary, _, _ = peer.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
    assert data == b" "
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:fds.itemsize])
    assert len(fds) == 1
    return fds[0]


@pytest.mark.parametrize("new_loop", loops())
def test_a_descriptor_crosses_a_transports_socket(
        new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    async def send() -> None:
        _, writer = await asyncio.open_unix_connection(sock=ours)
        try:
            with tempfile.TemporaryFile() as f:
                f.write(b"the stream")
                f.flush()
                send_fd_on(writer.transport.get_extra_info("socket"), f.fileno())
                got = received_fd(peer)
                try:
                    assert os.pread(got, 10, 0) == b"the stream"
                    assert os.fstat(got).st_ino == os.fstat(f.fileno()).st_ino
                finally:
                    os.close(got)
            writer.write(b"still usable")  # the transport's own socket was not closed
            await writer.drain()
            assert peer.recv(12) == b"still usable"
        finally:
            writer.close()
            peer.close()

    loop = new_loop()
    try:
        coro: Coroutine[Any, Any, None] = send()
        loop.run_until_complete(asyncio.wait_for(coro, timeout=10))
    finally:
        loop.close()
