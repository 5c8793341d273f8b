"""The control plane and a real `pandastack agent` process apart, on real microVMs: an agent
SIGKILLed or stalled (SIGSTOP) makes its sandboxes answer 503 `host_unavailable` while the
control plane's own requests keep answering, and once it is back every sandbox works again;
an API server SIGKILLed leaves the agent and its sandboxes untouched."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from pandastack.server.hostclient import HostClient
from tests.ports import free_port
from tests.server.conftest import Api, assert_envelope
from tests.server.live import ROOT, terminate, wait_healthy
from tests.server.vm_app import vm_app, vm_host

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


async def exec_out(api: Api, sid: str, cmd: str) -> str:
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd})
    assert r.status_code == 200, r.text
    out: str = r.json()["stdout"]
    return out


async def control_plane_answers(api: Api, sids: list[str]) -> None:
    """What needs no host: health, the store's listing, keys."""
    assert (await api.client.get("/health")).status_code == 200
    listed = (await api.client.get("/v1/sandboxes")).json()["sandboxes"]
    assert {s["id"]: s["state"] for s in listed} == {sid: "running" for sid in sids}
    await api.new_key("other-team")


async def test_agent_killed_or_stalled_then_back() -> None:
    async with vm_app("agent") as api:
        agent = api.agent
        sids = []
        for n in range(2):
            r = await api.client.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            sids.append(r.json()["id"])
            await api.client.put(f"/v1/sandboxes/{sids[-1]}/files", params={"path": "/work/n"},
                                 content=str(n).encode())

        agent.signal(signal.SIGKILL)
        for sid in sids:
            assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/exec",
                                                  json={"cmd": "true"}), 503, "host_unavailable")
        await control_plane_answers(api, sids)

        agent.start()  # the same state dir: it re-adopts both
        for n, sid in enumerate(sids):
            assert await exec_out(api, sid, "cat /work/n") == str(n)

        # Stalled: the agent's process is there but answers nothing. A lookup gives up after
        # its timeout (Timeouts.lookup: 10 s in the product, 2 s here while it is stalled).
        assert agent.proc is not None
        host = api.app.state.service.runtime
        assert isinstance(host, HostClient)
        caller = host._caller
        product = caller.timeouts
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            caller.timeouts = dataclasses.replace(product, lookup=2.0)
            await control_plane_answers(api, sids)
            assert_envelope(await api.client.get(f"/v1/sandboxes/{sids[0]}/network"),
                            503, "host_unavailable")
            await control_plane_answers(api, sids)
        finally:
            caller.timeouts = product
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert await exec_out(api, sids[0], "echo back") == "back\n"
        for sid in sids:
            assert (await api.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204


async def test_api_server_killed_leaves_the_agent_and_its_sandboxes() -> None:
    async with vm_host("agent") as host:
        agent = host.agent
        assert agent is not None
        tmp = agent.tmp
        port = free_port()
        env = {**os.environ, "PANDASTACK_DB": f"sqlite:///{tmp / 'server.db'}",
               "PANDASTACK_PORT": str(port), "PANDASTACK_CLIENT_CONFIG": str(tmp / "c.json"),
               "PANDASTACK_STATE_DIR": str(agent.state_dir)}
        url = f"http://127.0.0.1:{port}"

        def serve() -> subprocess.Popen[bytes]:
            log = (tmp / "server.log").open("ab")
            proc = subprocess.Popen([sys.executable, "-m", "pandastack", "serve", "--agent",
                                     agent.url, "--agent-token-file", str(agent.token_file)],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            wait_healthy(url, proc, tmp / "server.log", 60)
            return proc

        server = serve()
        key = json.loads((tmp / "c.json").read_text())["api_key"]
        headers = {"Authorization": f"Bearer {key}"}
        try:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
                sid = (await c.post("/v1/sandboxes", json={})).json()["id"]
                server.kill()
                server.wait()
                # The agent never noticed: its sandbox runs and answers.
                assert agent.proc is not None and agent.proc.poll() is None
                hosts = HostClient(agent.url, agent.token)
                try:
                    await hosts.start()
                    assert [s.id for s in await hosts.list_sandboxes()] == [sid]
                    sandbox = await hosts.get(sid)
                    assert (await sandbox.exec("echo alive")).stdout == b"alive\n"
                finally:
                    await hosts.close()
                server = serve()  # same database: the sandbox is still the team's
                r = await c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo again"})
                assert r.status_code == 200 and r.json()["stdout"] == "again\n", r.text
                assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        finally:
            terminate(server, 30)

