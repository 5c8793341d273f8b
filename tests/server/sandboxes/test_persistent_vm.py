"""A persistent sandbox's QEMU SIGKILLed, on real microVMs over both host ports (the runtime
in the server's process, and a real `pandastack agent` process): it becomes `stopped` and a
wake boots its disk with its files; with the agent, also when the agent itself was SIGKILLed
and restarted while its VM died, and a kill then removes the kept disk."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_server_restart import wait_gone
from tests.helpers import vmm_pids_under
from tests.server.conftest import Api
from tests.server.vm_app import vm_app

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


async def sh(api: Api, sid: str, cmd: str) -> dict[str, Any]:
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd}, timeout=300)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def until_state(api: Api, sid: str, state: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info: dict[str, Any] = (await api.client.get(f"/v1/sandboxes/{sid}")).json()
        if info["state"] == state or time.monotonic() > deadline:
            assert info["state"] == state, info
            return info
        await asyncio.sleep(0.3)


def kill_vmm(state_dir: Path, sid: str) -> None:
    pids = vmm_pids_under(state_dir / sid)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    wait_gone(pids[0])


@pytest.mark.parametrize("mode", ["in-process", "agent"])
async def test_a_dead_qemu_stops_a_persistent_sandbox_and_wake_boots_its_disk(
        mode: str) -> None:
    async with vm_app(mode) as api:
        state_dir: Path = api.app.state.service.settings.state_dir
        r = await api.client.post("/v1/sandboxes", json={"persistent": True})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert (await sh(api, sid, "echo kept > /work/f; sync"))["exit_code"] == 0
        kill_vmm(state_dir, sid)
        info = await until_state(api, sid, "stopped")
        assert info["stop_reason"] == "VM exited unexpectedly"
        r = await api.client.post(f"/v1/sandboxes/{sid}/wake", timeout=300)
        assert r.status_code == 200, r.text
        assert (r.json()["state"], r.json()["restored_from"]) == ("running", "disk")
        assert (await sh(api, sid, "cat /work/f"))["stdout"] == "kept\n"
        if api.agent is not None:
            # the agent dies, and the VM with it while none watches; the agent's start
            # adopts the directory as stopped, and the first exec boots it again
            assert (await sh(api, sid, "echo again >> /work/f; sync"))["exit_code"] == 0
            api.agent.signal(signal.SIGKILL)
            kill_vmm(state_dir, sid)
            api.agent.start()
            await until_state(api, sid, "stopped")
            assert (await sh(api, sid, "cat /work/f"))["stdout"] == "kept\nagain\n"
        assert (await api.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        assert not (state_dir / sid).exists()
