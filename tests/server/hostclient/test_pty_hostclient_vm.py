"""Terminals through the host API: HostClient against a real `pandastack agent` process (unix
socket) and a real microVM: POST .../pty, the WebSocket .../pty/{pid} (keystrokes, a resize,
output, the exit), a second attachment that replays the ring, and the errors of the host port
(an unknown pid is GuestOSError ESRCH, as in process). Nothing is left behind (live_agent)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest

from pandastack.hostport.errors import GuestOSError
from pandastack.hostport.pty import PtyExit, PtySession
from pandastack.server.hostclient import HostClient
from tests.server.live_agent import LiveAgent, live_agent

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

PROMPTLY = 60.0


@pytest.fixture(scope="module")
async def agent() -> AsyncIterator[LiveAgent]:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    async with live_agent() as a:
        yield a


async def read_until(session: PtySession, needle: bytes) -> bytes:
    seen = b""
    async with asyncio.timeout(PROMPTLY):
        while needle not in seen:
            item = await session.receive()
            assert not isinstance(item, PtyExit), (item, seen)
            seen += item
    return seen


async def test_terminal_over_the_host_api(agent: LiveAgent) -> None:
    async with HostClient(agent.url, agent.token) as client:
        sbx = await client.create("base")
        try:
            pid = await sbx.pty_create(cols=80, rows=24, cmd=["/bin/sh"])
            first = await sbx.pty_connect(pid)
            await first.send(b"stty size; echo A$((1))\n")
            assert b"24 80" in await read_until(first, b"A1\r\n")
            await first.resize(120, 40)
            await first.send(b"stty size; echo A$((2))\n")
            assert b"40 120" in await read_until(first, b"A2\r\n")
            await first.close()  # detached: the shell runs on
            second = await sbx.pty_connect(pid)
            assert b"A2" in await read_until(second, b"A2\r\n")  # the ring, replayed
            await sbx.signal(pid, signal.SIGKILL)
            async with asyncio.timeout(PROMPTLY):
                while not isinstance(item := await second.receive(), PtyExit):
                    pass
            assert item == PtyExit(137, 9)
            await second.close()
            with pytest.raises(GuestOSError) as missing:
                await sbx.pty_connect(pid + 100000)
            assert missing.value.errno_name == "ESRCH"
        finally:
            await client.kill(sbx.id)
