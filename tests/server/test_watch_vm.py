"""File watching over the host API (HostClient against a real `pandastack agent` process, as
a remote agent is driven), on a real microVM: the events of a create, write, rename, chmod
and remove in order; a flood of 100 k events the control plane does not read ends in
`overflow`, and the agent process's memory does not grow with the flood (its buffers are the
channel's credit window and the stream's outbox); leaving the stream stops the guest's watch."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.watch import WatchEvent
from pandastack.server.hostclient import HostClient
from tests.host.runtime.test_runtime_watch import FLOOD, brief
from tests.server.live_agent import LiveAgent, live_agent

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

GROWTH_LIMIT = 32 * 2**20
"""What the agent may grow by over the flood. Holding the 100 k events would take far more
(their frames alone are ~6 MiB, as Python objects ~10x); the bounded path holds ~2 MiB."""


@pytest.fixture(scope="module")
async def agent() -> AsyncIterator[LiveAgent]:
    async with live_agent() as a:
        yield a


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def guest_inotify_fds(sbx: SandboxPort) -> int:
    r = await sbx.exec("for p in /proc/[0-9]*; do ls -l $p/fd 2>/dev/null; done "
                       "| grep -c inotify || true")
    return int(r.stdout)


async def test_watch_over_the_host_api(agent: LiveAgent) -> None:
    assert agent.proc is not None
    async with HostClient(agent.url, agent.token) as client:
        sbx = await client.create("base")
        try:
            await sbx.mkdir("/work/w")
            batches = sbx.watch("/work/w")
            async with contextlib.aclosing(batches):  # type: ignore[type-var]
                assert await anext(batches) == [WatchEvent("watching", "/work/w")]
                await sbx.exec("cd /work/w && echo hi > a && mv a b && chmod 600 b && rm b")
                seen: list[tuple[str, ...]] = []
                while len(seen) < 5:
                    seen += [brief(e) for e in await anext(batches)]
                assert seen == [("create", "/work/w/a"), ("write", "/work/w/a"),
                                ("rename", "/work/w/a", "/work/w/b"), ("chmod", "/work/w/b"),
                                ("remove", "/work/w/b")]

                await sbx.write_file("/work/flood.py", FLOOD)
                before = rss(agent.proc.pid)
                assert (await sbx.exec(["python3", "/work/flood.py"])).exit_code == 0
                after = rss(agent.proc.pid)
                count, last = 0, None
                async for batch in batches:
                    count += len(batch)
                    last = batch[-1]
                assert last is not None and last.type == "overflow"
                assert count < 100_000
                assert after - before < GROWTH_LIMIT, (before, after)

            idle = await guest_inotify_fds(sbx)  # the guest's own, if any
            batches = sbx.watch("/work", recursive=True)
            assert (await anext(batches))[0].type == "watching"
            assert await guest_inotify_fds(sbx) == idle + 1
            await batches.aclose()  # type: ignore[attr-defined]
            for _ in range(100):  # bounded: the agent notices the closed stream, then cancels
                if await guest_inotify_fds(sbx) == idle:
                    break
            assert await guest_inotify_fds(sbx) == idle
        finally:
            await client.kill(sbx.id)
