"""File watching over the host API (HostClient against a real `pandastack agent` process, as
a remote agent is driven), on a real microVM: the events of a create, write, rename, chmod
and remove in order; a flood of 100 k events the control plane does not read ends in
`overflow`, and the agent process's memory does not grow with the flood (its buffers are the
channel's credit window and the stream's outbox); leaving the stream stops the guest's watch.
And the whole path: the SDK's watch through `pandastack serve --agent` on that agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.watch import WatchEvent
from pandastack.sdk import Sandbox
from pandastack.server.hostclient import HostClient
from tests.host.runtime.test_runtime_watch import FLOOD, brief
from tests.ports import free_port
from tests.server.live import terminate, wait_healthy
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
            async with contextlib.aclosing(batches):
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
            await batches.aclose()
            for _ in range(100):  # bounded: the agent notices the closed stream, then cancels
                if await guest_inotify_fds(sbx) == idle:
                    break
            assert await guest_inotify_fds(sbx) == idle
        finally:
            await client.kill(sbx.id)


@contextlib.contextmanager
def serve_over(agent: LiveAgent) -> Iterator[tuple[str, str]]:
    """`pandastack serve --agent` on `agent`, private DB and client config: (url, admin key)."""
    tmp = agent.tmp / "serve"
    tmp.mkdir()
    port = free_port()
    env = {**os.environ, "PANDASTACK_DB": f"sqlite:///{tmp / 'db'}",
           "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
           "PANDASTACK_STATE_DIR": str(tmp / "s")}
    url = f"http://127.0.0.1:{port}"
    with (tmp / "log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port),
             "--agent", agent.url, "--agent-token-file", str(agent.token_file)],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc, tmp / "log", 120)
        yield url, json.loads((tmp / "client.json").read_text())["api_key"]
    finally:
        terminate(proc, 30)


def sdk_watch(url: str, key: str) -> list[tuple[str, str, str | None]]:
    with Sandbox.create(api_url=url, api_key=key, ttl_seconds=300) as sbx:
        sbx.files.mkdir("/work/w")
        seen: list[tuple[str, str, str | None]] = []
        with sbx.files.watch("/work/w") as w:
            sbx.exec("cd /work/w && echo hi > a && mv a b && chmod 600 b && rm b")
            for e in w:
                seen.append((e.type, e.path, e.old_path))
                if len(seen) == 5:
                    break
        return seen


async def test_sdk_watch_through_serve_over_the_agent(agent: LiveAgent) -> None:
    with serve_over(agent) as (url, key):
        assert await asyncio.to_thread(sdk_watch, url, key) == [
            ("create", "/work/w/a", None), ("write", "/work/w/a", None),
            ("rename", "/work/w/b", "/work/w/a"), ("chmod", "/work/w/b", None),
            ("remove", "/work/w/b", None)]
