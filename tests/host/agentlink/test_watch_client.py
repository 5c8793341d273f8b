"""`watch` of AgentClient against the real guest agent (a subprocess on this host, as in
test_agent_client): events in order, recursion into new and renamed directories, a move out
of the tree, errors before the stream, overflow with the host's share bounded by the credit
window, and a stopped watch frees its inotify instance in the agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.guest.watch import MAX_QUEUED
from pandastack.guestproto import frames as P
from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import GuestOSError
from pandastack.hostport.watch import WatchEvent
from tests.host.agentlink.test_agent_client import local_agent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def agent() -> AsyncIterator[AgentClient]:
    async with local_agent() as client:
        yield client


def brief(e: WatchEvent, root: Path) -> tuple[str, ...]:
    rel = os.path.relpath(e.path, root)
    if e.old_path is None:
        return (e.type, rel)
    return (e.type, os.path.relpath(e.old_path, root), rel)


async def collect(batches: AsyncIterator[list[WatchEvent]], n: int,
                  root: Path) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    while len(seen) < n:
        seen += [brief(e, root) for e in await asyncio.wait_for(anext(batches), 20)]
    return seen


def inotify_fds(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd) == "anon_inode:inotify"
    return count


async def test_events_in_order(agent: AgentClient, tmp_path: Path) -> None:
    batches = agent.watch(str(tmp_path))
    async with contextlib.aclosing(batches):
        assert await anext(batches) == [WatchEvent("watching", str(tmp_path))]
        (tmp_path / "a").write_text("hi")
        (tmp_path / "a").rename(tmp_path / "b")
        (tmp_path / "b").chmod(0o600)
        (tmp_path / "b").unlink()
        assert await collect(batches, 5, tmp_path) == [
            ("create", "a"), ("write", "a"), ("rename", "a", "b"), ("chmod", "b"),
            ("remove", "b")]


async def test_recursive_follows_new_and_renamed_directories(agent: AgentClient,
                                                             tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    root = tmp_path / "root"
    outside.mkdir()
    root.mkdir()
    batches = agent.watch(str(root))
    async with contextlib.aclosing(batches):
        await anext(batches)
        (root / "d").mkdir()
        assert await collect(batches, 1, root) == [("create", "d")]
        (root / "d" / "f").touch()
        assert await collect(batches, 1, root) == [("create", "d/f")]
        (root / "d").rename(root / "e")
        (root / "e" / "g").touch()  # the watch of d now names e
        assert await collect(batches, 2, root) == [("rename", "d", "e"), ("create", "e/g")]
        (root / "e").rename(outside / "e")  # out of the tree: a remove, and unfollowed
        (outside / "e" / "h").touch()
        (root / "last").touch()
        assert await collect(batches, 2, root) == [("remove", "e"), ("create", "last")]


async def test_not_recursive_sees_only_the_directory(agent: AgentClient,
                                                     tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    batches = agent.watch(str(tmp_path), recursive=False)
    async with contextlib.aclosing(batches):
        await anext(batches)
        (tmp_path / "d" / "inner").touch()
        (tmp_path / "top").touch()
        assert await collect(batches, 1, tmp_path) == [("create", "top")]


async def test_errors_come_before_any_event(agent: AgentClient, tmp_path: Path) -> None:
    with pytest.raises(GuestOSError) as missing:
        await anext(agent.watch(str(tmp_path / "none")))
    assert missing.value.errno_name == "ENOENT"
    (tmp_path / "file").touch()
    with pytest.raises(GuestOSError) as not_dir:
        await anext(agent.watch(str(tmp_path / "file")))
    assert not_dir.value.errno_name == "ENOTDIR"
    assert await agent.ping() > 0  # the channel is fine


async def test_removing_the_directory_ends_the_watch(agent: AgentClient,
                                                     tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    batches = agent.watch(str(root))
    await anext(batches)
    root.rmdir()
    rest = [e async for batch in batches for e in batch]
    assert [e.type for e in rest] == []  # no event for the root itself: the stream ends


async def test_a_flood_ends_in_overflow_within_the_window(agent: AgentClient,
                                                          tmp_path: Path) -> None:
    batches = agent.watch(str(tmp_path))
    async with contextlib.aclosing(batches):
        await anext(batches)

        def flood() -> None:
            for i in range(3 * MAX_QUEUED):
                (tmp_path / f"f{i}").touch()

        await asyncio.to_thread(flood)  # the host reads nothing meanwhile
        held = [agent._buffered_bytes()]
        events: list[WatchEvent] = []
        async for batch in batches:
            events += batch
            held.append(agent._buffered_bytes())
        assert events[-1].type == "overflow"
        assert len(events) < 3 * MAX_QUEUED
        assert max(held) <= P.INITIAL_WINDOW
        creates = [e.path for e in events if e.type == "create"]
        assert creates == [str(tmp_path / f"f{i}") for i in range(len(creates))]  # in order
    assert agent.agent_pid is not None
    deadline = time.monotonic() + 30  # the guest drops an ended watch at once; bounded wait for it
    while inotify_fds(agent.agent_pid) != 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert inotify_fds(agent.agent_pid) == 0


async def test_stop_frees_the_watch_in_the_agent(agent: AgentClient, tmp_path: Path) -> None:
    assert agent.agent_pid is not None
    batches = agent.watch(str(tmp_path))
    await anext(batches)
    assert inotify_fds(agent.agent_pid) == 1
    await batches.aclose()
    deadline = time.monotonic() + 30  # the cancel is fire-and-forget: bounded wait for the agent
    while inotify_fds(agent.agent_pid) != 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert inotify_fds(agent.agent_pid) == 0


async def test_a_trickle_the_host_does_not_read_holds_few_frames(agent: AgentClient,
                                                                 tmp_path: Path) -> None:
    """Events that come one at a time go one per frame: the credit each frame costs (at
    least WATCH_FRAME_CREDIT) bounds how many wait on the host, not only their bytes."""
    batches = agent.watch(str(tmp_path))
    async with contextlib.aclosing(batches):
        await anext(batches)
        n = 2000  # far more frames than the window allows, far fewer events than MAX_QUEUED

        def trickle() -> None:
            for i in range(n):
                (tmp_path / f"f{i}").touch()
                time.sleep(0.0005)

        await asyncio.to_thread(trickle)
        op = next(o for o in agent._ops.values() if o.kind == "watch")
        # what the frames waiting here cost the host (their bytes and their overhead)
        assert op.cost <= P.INITIAL_WINDOW, (op.cost, op.queue.qsize())
        creates: list[str] = []
        while len(creates) < n:
            creates += [e.path for e in await asyncio.wait_for(anext(batches), 20)]
        assert creates == [str(tmp_path / f"f{i}") for i in range(n)]
