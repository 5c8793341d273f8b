"""A sandbox survives what its user does to it, through the public SDK against an in-process
server with real microVMs: a fork bomb ends at its timeout with its whole tree killed and the
next command answers at once (also one that is running while the bomb is); a bomb of big
processes is held by the user cgroup's memory limit and OOM killer, never the kernel's global
one (which could take the agent); a memory hog is OOM-killed. (An output flood past the
bound: test_api_vm_flood.py, in the parallel lane.) Each test gets a sandbox of its own, so
one abuse cannot hide behind another."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from pandastack import AsyncSandbox
from tests.server.conftest import Api
from tests.server.vm_app import vm_app

# Fork and memory bombs hold both cores for seconds, and what is asserted has time bounds:
# the serial lane, so they neither slow nor are slowed by a second worker's VMs.
pytestmark = [pytest.mark.vm, pytest.mark.serial]

# `make test` runs each test in one host mode, two in-process, one agent (tests/lanes.py
# marks the other mode `soak`; `make soak` runs both): what contains a bomb is the guest's cgroups,
# the same whichever host port carries the exec, and both modes' exec, timeout and output
# paths stay in make test. Each variant is ~20 s of a lane where nothing else runs.
MAKE_TEST_MODE = {
    "test_fork_bomb_times_out_and_the_sandbox_keeps_answering": "in-process",
    "test_memory_hog_is_oom_killed_and_the_sandbox_survives": "in-process",
    "test_fork_bomb_that_fills_memory_is_killed_not_the_agent": "agent",
}

BOMB = "bash -c ':(){ :|:& };:'; sleep 60"
MEMORY_BOMB = ("python3 -c 'import os\nh = []\nwhile True:\n try:\n  os.fork()\n"
               "  h.append(bytearray(1 << 20))\n except (OSError, MemoryError): pass'; sleep 60")
BOMB_TIMEOUT = 15.0
# Returning at the timeout takes the kill, the exit grace and a loaded guest's reply; the
# host's own deadline (timeout + 30 s) is what a starved agent hits, so stay well under it.
SLACK = 20.0
PIDS_CURRENT = "cat /sys/fs/cgroup/pandastack/pids.current"
# pids.current of the user subtree while the check itself runs: its shell and its `cat`.
CHECK_PIDS_MAX = 3
BOMB_PIDS_MIN = 256


@pytest.fixture(scope="module")
async def api(host_mode: str) -> AsyncIterator[Api]:
    async with vm_app(host_mode) as a:
        yield a


@pytest.fixture
async def sbx(api: Api) -> AsyncIterator[AsyncSandbox]:
    transport = httpx.ASGITransport(api.app, raise_app_exceptions=False)
    async with await AsyncSandbox.create(ttl_seconds=300, api_url="http://test",
                                         api_key=api.admin_key, transport=transport) as s:
        yield s


async def _user_pids(sbx: AsyncSandbox) -> int:
    r = await sbx.exec(PIDS_CURRENT, timeout_seconds=30)
    assert r.exit_code == 0, r
    return int(r.stdout)


async def test_fork_bomb_times_out_and_the_sandbox_keeps_answering(sbx: AsyncSandbox) -> None:
    started = time.monotonic()
    bomb_call = asyncio.create_task(sbx.exec(BOMB, timeout_seconds=BOMB_TIMEOUT))
    # Execs while the bomb runs: each must answer, and one must see the bomb in full swing
    # (not still starting, nor over). How fast the bomb grows depends on the host's load
    # (a loaded CI host had 202 processes at half the timeout), so this asks until it sees
    # it, up to shortly before the bomb's own timeout.
    seen: list[int] = []
    try:
        while time.monotonic() - started < BOMB_TIMEOUT - 3 and not bomb_call.done():
            await asyncio.sleep(1.0)
            asked = time.monotonic()
            during = await sbx.exec(PIDS_CURRENT, timeout_seconds=BOMB_TIMEOUT)
            answered_in = time.monotonic() - asked
            assert during.exit_code == 0, during
            assert answered_in < SLACK, f"an exec during the bomb took {answered_in:.1f} s"
            seen.append(int(during.stdout))
            if seen[-1] >= BOMB_PIDS_MIN:
                break
    finally:
        bomb = await bomb_call
    took = time.monotonic() - started
    assert bomb.timed_out, bomb
    assert took < BOMB_TIMEOUT + SLACK, f"the bomb's exec took {took:.1f} s"
    assert seen and max(seen) >= BOMB_PIDS_MIN, f"user pids seen during the bomb: {seen}"
    started = time.monotonic()
    left = await _user_pids(sbx)  # the first exec after the bomb
    took = time.monotonic() - started
    assert left <= CHECK_PIDS_MAX, f"{left} user pids: the bomb's were not all killed"
    assert took < SLACK, f"the exec after the bomb took {took:.1f} s"
    after = await sbx.exec("echo alive", timeout_seconds=30)
    assert after.stdout == "alive\n" and after.exit_code == 0, after


async def test_memory_hog_is_oom_killed_and_the_sandbox_survives(sbx: AsyncSandbox) -> None:
    hog = await sbx.exec(["python3", "-c", "h = []\nwhile True: h.append(b'x' * (32 << 20))"],
                         timeout_seconds=120)
    assert hog.signal == 9 and not hog.timed_out, hog
    # The user subtree's limit struck, not the kernel's last resort (which could pick the agent).
    events = await sbx.exec("grep oom_kill /sys/fs/cgroup/pandastack/memory.events")
    assert int(events.stdout.split()[1]) >= 1, events
    assert (await sbx.exec("echo alive")).stdout == "alive\n"
    assert await _user_pids(sbx) <= CHECK_PIDS_MAX


async def test_fork_bomb_that_fills_memory_is_killed_not_the_agent(sbx: AsyncSandbox) -> None:
    # Few processes, each a few MiB: the guest's memory runs out long before its process limit.
    # The user cgroup's limit holds it: the kernel reclaims inside that cgroup and, when that
    # fails, OOM-kills there. Which of the two ends a given run depends on how fast it
    # thrashes (with the binary agent 15 s often end in reclaim alone), so what is asserted is
    # that the limit was hit and that no OOM kill happened outside the user cgroup (the
    # kernel's global OOM killer could take the agent), and the agent is the same process.
    agent_before = await sbx.exec("cat /sys/fs/cgroup/agent/cgroup.procs")
    started = time.monotonic()
    bomb = await sbx.exec(MEMORY_BOMB, timeout_seconds=BOMB_TIMEOUT)
    took = time.monotonic() - started
    assert bomb.timed_out, bomb
    assert took < BOMB_TIMEOUT + SLACK, f"the bomb's exec took {took:.1f} s"
    assert await _user_pids(sbx) <= CHECK_PIDS_MAX, "the bomb's processes were not all killed"
    events = await sbx.exec("cat /sys/fs/cgroup/pandastack/memory.events")
    counts = dict(line.split() for line in events.stdout.splitlines())
    assert int(counts["max"]) >= 1, events  # the user cgroup's limit is what bounded it
    # Every OOM kill in the guest (/proc/vmstat counts all) was one inside the user cgroup.
    everywhere = await sbx.exec("grep -w oom_kill /proc/vmstat")
    assert everywhere.stdout.split() == ["oom_kill", counts["oom_kill"]], (everywhere, events)
    agent_after = await sbx.exec("cat /sys/fs/cgroup/agent/cgroup.procs")
    assert agent_after.stdout == agent_before.stdout, (agent_before, agent_after)
    assert (await sbx.exec("echo alive")).stdout == "alive\n"

