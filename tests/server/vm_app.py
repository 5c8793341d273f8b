"""The app over a real host, in either of the host port's implementations: the runtime in the
server's process (`in-process`, what `pandastack serve` runs) or a real `pandastack agent`
process on a unix socket (`agent`, what `pandastack serve --agent` drives). The API VM suites
make their `api` fixture with it over conftest's `host_mode`, so that each of their tests runs
against both. Either way the host has a private state dir and snapshot dir (sharing the
template cache), and on the way out whatever is left is killed and the test fails on it."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.server.settings import Settings
from tests.helpers import vmm_pids_under
from tests.leftovers import owned_tmpdir
from tests.server.conftest import Api, make_settings, running_app
from tests.server.live_agent import LiveAgent, assert_nothing_left, stop_cleanly


def vm_settings(tmp: Path, **overrides: object) -> Settings:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    state = tmp / "s"  # short: unix socket paths must stay under 108 bytes
    return make_settings(tmp, **{"state_dir": state, **overrides})


def short_tmp() -> Path:
    return owned_tmpdir("pss-")


@dataclass
class VMHost:
    """What an app over this host is made with: `running_app(settings, runtime)`; `runtime`
    is the in-process HostRuntime (None in agent mode, where `agent` is the process)."""

    settings: Settings
    runtime: HostRuntime | None
    agent: LiveAgent | None


@asynccontextmanager
async def vm_host(mode: str = "in-process", **overrides: object) -> AsyncIterator[VMHost]:
    """A real host (`mode`: one of conftest.HOST_MODES) on private dirs; `overrides` are
    Settings. On the way out: the agent must stop cleanly on SIGTERM, then whatever is left
    in its dirs (sandboxes, snapshots, files, VMM processes) is killed and fails the test."""
    tmp = short_tmp()
    agent = LiveAgent(tmp)  # its dirs are the in-process runtime's too
    pids: list[int] = []
    try:
        if mode == "agent":
            agent.start()
            yield VMHost(vm_settings(tmp, state_dir=agent.state_dir, agent=agent.url,
                                     agent_token_file=agent.token_file, **overrides),
                         None, agent)
            stop_cleanly(agent)
        else:
            assert mode == "in-process", mode
            config = HostConfig.from_env(state_dir=agent.state_dir,
                                         snapshots_root=agent.snapshots_dir,
                                         volumes_root=agent.volumes_dir)
            runtime = HostRuntime(config, progress=lambda _m: None)
            try:
                yield VMHost(vm_settings(tmp, state_dir=agent.state_dir, **overrides),
                             runtime, None)
            finally:
                await runtime.close()  # its VMs keep running: the check below finds them
    finally:
        try:
            await assert_nothing_left(agent, f"the tests ({mode})")
        finally:
            pids = vmm_pids_under(tmp)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(tmp, ignore_errors=True)
    assert not pids, f"VMM processes left: {pids}"


@asynccontextmanager
async def vm_app(mode: str = "in-process", **overrides: object) -> AsyncIterator[Api]:
    """A started app over `vm_host(mode, **overrides)`; `Api.agent` is its LiveAgent (None
    in-process)."""
    async with vm_host(mode, **overrides) as host, \
            running_app(host.settings, host.runtime) as api:
        api.agent = host.agent
        yield api
