"""Background processes followed over the host API: HostClient against a real `pandastack
agent` process (unix socket) and one real microVM. A spawn's timeout reaches the guest (the
exit says timed_out); an attach opens with the REPLAY frame (what the rings dropped) before the
replayed and live output, with `keep_output=False` keeping nothing for the result; an unknown
pid is GuestOSError ESRCH as in process; a spawn-attach tells the pid (SPAWNED) before the
output. Nothing is left behind (live_agent checks)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from pandastack.hostport.errors import GuestOSError
from pandastack.server.hostclient import HostClient
from tests.server.live_agent import LiveAgent, live_agent

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

RING = 1 << 20
PROMPTLY = 60.0


@pytest.fixture(scope="module")
async def agent() -> AsyncIterator[LiveAgent]:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    async with live_agent() as a:
        yield a


async def test_spawn_timeout_and_attach_replay_over_the_host_api(agent: LiveAgent) -> None:
    async with HostClient(agent.url, agent.token) as client:
        sbx = await client.create("base")
        try:
            over = 100_000
            # The timeout must leave a loaded TCG guest time to write it all (the replay
            # below counts every byte); it is waited out once, so not longer.
            pid = await sbx.spawn(f"head -c {RING + over} /dev/zero; echo e >&2; sleep 300",
                                  timeout=10)
            order: list[str] = []
            told: list[tuple[int, int]] = []
            first_stdout = asyncio.Event()

            async def dropped(out: int, err: int) -> None:
                told.append((out, err))
                order.append("dropped")

            def stdout(data: bytes) -> None:
                order.append("stdout")
                first_stdout.set()

            async with asyncio.timeout(PROMPTLY):
                # Wait for the exit once (keeping its output), then follow it again.
                first = await sbx.attach(pid)
                assert first.timed_out and first.exit_code == 137
                result = await sbx.attach(pid, on_stdout=stdout, on_dropped=dropped,
                                          keep_output=False)
            assert told == [(over, 0)] and order[0] == "dropped" and first_stdout.is_set()
            assert result.timed_out and result.exit_code == 137
            assert result.stdout == b"" and result.stderr == b""  # kept nothing
            listed = {p["pid"]: p for p in await sbx.procs()}
            assert listed[pid]["timed_out"] is True
            with pytest.raises(GuestOSError) as missing:
                await sbx.attach(999_999)
            assert missing.value.errno_name == "ESRCH"
        finally:
            await client.kill(sbx.id)


async def test_spawn_attach_over_the_host_api(agent: LiveAgent) -> None:
    """The SPAWNED frame (the pid) comes before the output; the process is a background one,
    so stdin by pid reaches it while the call follows it; a program that cannot run is the
    guest's error, with no pid told."""
    async with HostClient(agent.url, agent.token) as client:
        sbx = await client.create("base")
        try:
            order: list[object] = []
            pids: asyncio.Queue[int] = asyncio.Queue()

            def spawned(pid: int) -> None:
                order.append(pid)
                pids.put_nowait(pid)

            async with asyncio.timeout(PROMPTLY):
                call = asyncio.create_task(sbx.spawn_attach(
                    "echo up; read line; echo got $line >&2", on_spawned=spawned,
                    on_stdout=order.append, on_stderr=order.append, user="user"))
                pid = await pids.get()
                await sbx.send_stdin(pid, b"hi\n", eof=True)
                result = await call
            assert order == [pid, b"up\n", b"got hi\n"]
            assert (result.exit_code, result.stdout, result.stderr) == (0, b"up\n", b"got hi\n")
            listed = {p["pid"]: p for p in await sbx.procs()}
            assert listed[pid]["background"] is True
            told: list[int] = []
            with pytest.raises(GuestOSError) as missing:
                await sbx.spawn_attach(["/nonexistent/program"], on_spawned=told.append)
            assert missing.value.errno_name == "ENOENT" and told == []
        finally:
            await client.kill(sbx.id)
