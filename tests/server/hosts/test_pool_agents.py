"""The REST API over two real `pandastack agent` processes (one machine, one template cache,
separate state dirs), on real microVMs: creates spread over both, every operation reaches
the sandbox's own host, a fork stays with its parent, and a SIGKILLed agent takes only its
own sandboxes out of reach, until it is back."""

from __future__ import annotations

import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.leftovers import owned_tmpdir
from tests.server.conftest import Api, assert_envelope, running_app
from tests.server.live_agent import LiveAgent, assert_nothing_left, stop_cleanly
from tests.server.vm_app import vm_settings

# Agents heartbeat every 0.5 s and are lost after 3 s: beside a second test worker's VMs a
# heartbeat came late and fenced a host mid-test, so this module runs in the serial lane.
pytestmark = [pytest.mark.vm, pytest.mark.timeout(600), pytest.mark.serial]


@asynccontextmanager
async def two_agents() -> AsyncIterator[tuple[Api, list[LiveAgent]]]:
    tmp = owned_tmpdir("ppa-")
    agents = [LiveAgent(tmp / name) for name in ("a", "b")]
    for agent in agents:
        agent.tmp.mkdir()
    try:
        for agent in agents:
            agent.start()
        settings = vm_settings(tmp, agent=",".join(a.url for a in agents))
        async with running_app(settings) as api:
            yield api, agents
        for agent in agents:
            stop_cleanly(agent)
    finally:
        failures: list[AssertionError] = []
        for agent in agents:  # every agent is cleaned up, even after one failed its check
            try:
                await assert_nothing_left(agent)
            except AssertionError as exc:
                failures.append(exc)
        shutil.rmtree(tmp, ignore_errors=True)
        if failures:
            raise failures[0]


async def test_two_agents_share_the_load_and_fail_apart() -> None:
    async with two_agents() as (api, agents):
        c = api.client
        sids = []
        for _ in range(2):
            r = await c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            sids.append(r.json()["id"])
        # One on each agent: each agent's state dir holds one sandbox directory.
        homes = {sid: next(i for i, a in enumerate(agents) if (a.state_dir / sid).is_dir())
                 for sid in sids}
        assert sorted(homes.values()) == [0, 1], homes
        for sid in sids:
            r = await c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": f"echo {sid}"})
            assert r.status_code == 200 and r.json()["stdout"] == f"{sid}\n", r.text

        r = await c.post(f"/v1/sandboxes/{sids[0]}/fork", json={"count": 1})
        assert r.status_code in (200, 201), r.text
        child = r.json()["sandboxes"][0]["id"]
        assert (agents[homes[sids[0]]].state_dir / child).is_dir()

        lost = agents[homes[sids[1]]]
        lost.signal(signal.SIGKILL)
        assert_envelope(await c.post(f"/v1/sandboxes/{sids[1]}/exec", json={"cmd": "true"}),
                        503, "host_unavailable")
        r = await c.post(f"/v1/sandboxes/{child}/exec", json={"cmd": "true"})
        assert r.status_code == 200, r.text
        lost.start()
        r = await c.post(f"/v1/sandboxes/{sids[1]}/exec", json={"cmd": "echo back"})
        assert r.status_code == 200 and r.json()["stdout"] == "back\n", r.text

        for sid in [*sids, child]:
            assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
