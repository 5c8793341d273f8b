"""File watching on a real VM (guest inotify, the agent channel's credit): the events of a
create, write, rename, chmod and remove come in that order; a flood of 100 k events the host
does not read ends in `overflow`, while what the host holds for the watch stays within the
channel's credit window; the guest drops the watch (its inotify instance) once it ended."""

from __future__ import annotations

import contextlib

import pytest

from pandastack.guestproto import frames as P
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.watch import WatchEvent

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

# 100 k IN_MODIFY events: writes alternate between two files, so neither the kernel (which
# merges identical adjacent events) nor the guest (a run of writes to one file) merges them.
FLOOD = b"""
import os
a = os.open("/work/w/a", os.O_WRONLY | os.O_CREAT)
b = os.open("/work/w/b", os.O_WRONLY | os.O_CREAT)
for _ in range(50_000):
    os.write(a, b"x")
    os.write(b, b"x")
"""


def brief(e: WatchEvent) -> tuple[str, ...]:
    return (e.type, e.path) if e.old_path is None else (e.type, e.old_path, e.path)


async def inotify_fds(sandbox: SandboxHandle, pid: int) -> int:
    r = await sandbox.exec(f"ls -l /proc/{pid}/fd | grep -c inotify || true")
    return int(r.stdout)


async def test_events_in_order_then_a_flood_ends_in_overflow(sandbox: SandboxHandle) -> None:
    await sandbox.mkdir("/work/w")
    agent = await sandbox.agent()
    assert agent.agent_pid is not None
    batches = agent.watch("/work/w")
    async with contextlib.aclosing(batches):
        assert await anext(batches) == [WatchEvent("watching", "/work/w")]
        await sandbox.exec("cd /work/w && echo hi > a && mv a b && chmod 600 b && rm b")
        seen: list[tuple[str, ...]] = []
        while len(seen) < 5:
            seen += [brief(e) for e in await anext(batches)]
        assert seen == [("create", "/work/w/a"), ("write", "/work/w/a"),
                        ("rename", "/work/w/a", "/work/w/b"), ("chmod", "/work/w/b"),
                        ("remove", "/work/w/b")]

        await sandbox.write_file("/work/flood.py", FLOOD)
        assert (await sandbox.exec(["python3", "/work/flood.py"])).exit_code == 0
        # The flood is over and the host read none of it: the guest stopped at the window.
        held = [agent._buffered_bytes()]
        assert held[0] <= P.INITIAL_WINDOW
        count = 0
        last = None
        async for batch in batches:
            count += len(batch)
            last = batch[-1]
            held.append(agent._buffered_bytes())
        assert last is not None and last.type == "overflow"
        assert count < 100_000  # events were dropped, and said so
        assert max(held) <= P.INITIAL_WINDOW, max(held)
    assert await inotify_fds(sandbox, agent.agent_pid) == 0


async def test_stopping_a_watch_frees_it_in_the_guest(sandbox: SandboxHandle) -> None:
    agent = await sandbox.agent()
    assert agent.agent_pid is not None
    batches = agent.watch("/work", recursive=True)
    assert (await anext(batches))[0].type == "watching"
    assert await inotify_fds(sandbox, agent.agent_pid) == 1
    await batches.aclose()
    for _ in range(100):  # the cancel is fire-and-forget: bounded wait for the guest to act
        if await inotify_fds(sandbox, agent.agent_pid) == 0:
            break
    assert await inotify_fds(sandbox, agent.agent_pid) == 0
