"""The REST API against real microVMs, over each of the host port's implementations (the
runtime in the server's process, and a `pandastack agent` process: tests/server/vm_app.py) on
a private state dir (sharing the template cache) and a temp SQLite DB. Few VMs: about five in
the whole module per host mode; `make test` runs most tests in one mode (MAKE_TEST_MODE)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import qemu_pids_under
from tests.server.conftest import Api, assert_envelope, running_app
from tests.server.vm_app import vm_app, vm_host
from tests.server.web.test_metrics_fake import samples

pytestmark = pytest.mark.vm

# `make test` runs these in one host mode, alternating (tests/lanes.py marks the other mode
# `soak`; `make soak` runs both): what each checks is the REST layer above the host port,
# and each mode's transport of exec, streams, files and processes is checked below it too
# (tests/server/hostclient/test_hostclient_vm.py drives a real agent). The agent mode keeps
# the metrics test (the agent's own /metrics); the restart test runs in both, since what a
# restart adopts differs (a new runtime re-adopts the VM; the agent keeps it).
MAKE_TEST_MODE = {
    "test_exec": "in-process",
    "test_metrics_measured_in_the_guest": "agent",
    "test_exec_stream": "agent",
    "test_files": "in-process",
    "test_processes": "agent",
    "test_lifecycle_and_logs": "in-process",
    "test_auth_and_teams": "agent",
    "test_ttl_expiry_removes_the_vm": "agent",
    "test_idle_reaper": "in-process",
}


@pytest.fixture(scope="module")
async def api(host_mode: str) -> AsyncIterator[Api]:
    async with vm_app(host_mode) as a:
        yield a


@pytest.fixture(scope="module")
async def sbx(api: Api) -> AsyncIterator[str]:
    r = await api.client.post(
        "/v1/sandboxes", json={"env": {"GREETING": "hello"}, "metadata": {"suite": "vm"}}
    )
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["state"] == "running"
    yield str(info["id"])
    assert (await api.client.delete(f"/v1/sandboxes/{info['id']}")).status_code == 204


async def exec_(api: Api, sid: str, **body: object) -> dict[str, object]:
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, object] = r.json()
    return result


async def test_exec(api: Api, sbx: str) -> None:
    r = await exec_(api, sbx, cmd="python -c 'print(6*7)'")
    assert (r["exit_code"], r["stdout"], r["timed_out"]) == (0, "42\n", False)
    r = await exec_(api, sbx, cmd="echo $GREETING $X; echo oops >&2; exit 3", env={"X": "y"})
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "hello y\n", "oops\n")
    r = await exec_(
        api, sbx, cmd=["python3", "-c", "import sys; sys.stdout.buffer.write(b'\\xff')"]
    )
    assert r["stdout"] == "\ufffd"
    r = await exec_(api, sbx, cmd="cat", stdin="piped")
    assert r["stdout"] == "piped"
    started = time.monotonic()
    r = await exec_(api, sbx, cmd="sleep 30", timeout_seconds=1)
    assert r["timed_out"] is True and time.monotonic() - started < 20


async def test_metrics_measured_in_the_guest(api: Api, sbx: str) -> None:
    """The guest's memory is the sandbox's, its disk is there, a busy loop shows in its CPU
    use; the server's /metrics (loopback: open) counted the create, and in agent mode the
    agent's /metrics its calls."""
    c, url = api.client, f"/v1/sandboxes/{sbx}/metrics"
    info = (await c.get(f"/v1/sandboxes/{sbx}")).json()
    r = await c.get(url, params={"window_ms": 500})
    assert r.status_code == 200, r.text
    idle = r.json()
    ram = info["memory_mb"] << 20  # MemTotal: the RAM less what the kernel keeps
    assert 0.8 * ram <= idle["memory_total_bytes"] <= ram, idle
    assert 0 < idle["memory_used_bytes"] < idle["memory_total_bytes"]
    assert 0 < idle["disk_used_bytes"] < idle["disk_total_bytes"]
    assert (idle["cpu_count"], idle["window_ms"]) == (info["vcpus"], 500)
    loop = "import time\nend = time.monotonic() + 2.5\nwhile time.monotonic() < end: pass"
    r = await c.post(f"/v1/sandboxes/{sbx}/processes", json={"cmd": ["python3", "-c", loop]})
    assert r.status_code == 201, r.text
    pid = r.json()["pid"]
    busy = (await c.get(url, params={"window_ms": 1000})).json()
    assert busy["cpu_percent"] >= 50 and busy["cpu_percent"] > idle["cpu_percent"] + 25, (
        idle, busy)
    r = await c.post(f"/v1/sandboxes/{sbx}/processes/{pid}/wait",
                     params={"timeout_seconds": 30})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

    r = await c.get("/metrics")
    assert r.status_code == 200, r.text
    server = samples(r.text)
    assert server[("pandastack_sandbox_operation_seconds_count",
                   (("operation", "create"),))] >= 1
    assert server[("pandastack_sandboxes", (("state", "running"),))] >= 1
    if api.agent is not None:
        transport = httpx.AsyncHTTPTransport(uds=str(api.agent.socket))
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as agent:
            r = await agent.get("/metrics")  # a unix socket: open, as loopback
        assert r.status_code == 200, r.text
        got = samples(r.text)
        assert got[("pandastack_agent_operation_seconds_count",
                    (("operation", "getSandboxMetrics"),))] >= 2
        assert got[("pandastack_agent_sandboxes", (("state", "running"),))] >= 1
        assert ("pandastack_agent_guest_channel_failures_total",
                (("kind", "timeout"),)) in got
        # The agent process's memory admission (ADR 0050): its default reserve, >= 1 GiB.
        assert got[("pandastack_agent_memory_reserve_bytes", ())] >= 1 << 30
        assert ("pandastack_agent_memory_reserved_bytes", ()) in got


def parse_sse(text: str) -> list[tuple[str, dict[str, object]]]:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_exec_stream(api: Api, sbx: str) -> None:
    cmd = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done; exit 7"
    r = await api.client.post(f"/v1/sandboxes/{sbx}/exec/stream", json={"cmd": cmd})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    kinds = [e for e, _ in events]
    assert kinds[-1] == "exit" and kinds.count("exit") == 1
    out = "".join(str(d["data"]) for e, d in events if e == "stdout")
    err = "".join(str(d["data"]) for e, d in events if e == "stderr")
    assert (out, err) == ("out1\nout2\nout3\n", "err1\nerr2\nerr3\n")
    final = events[-1][1]
    assert (final["exit_code"], final["stdout"], final["stderr"]) == (7, "", "")


async def test_files(api: Api, sbx: str) -> None:
    c = api.client
    base = f"/v1/sandboxes/{sbx}/files"
    blob = os.urandom(3 << 20)
    r = await c.put(base, params={"path": "/work/data/blob.bin", "mode": "600"}, content=blob)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/work/data/blob.bin", "size": len(blob)}
    r = await c.get(base, params={"path": "/work/data/blob.bin"})
    assert (
        r.status_code == 200 and hashlib.sha256(r.content).digest() == hashlib.sha256(blob).digest()
    )
    st = (await c.get(f"{base}/stat", params={"path": "/work/data/blob.bin"})).json()
    assert (st["type"], st["size"], st["mode"] & 0o777) == ("file", len(blob), 0o600)
    assert (
        await c.post(f"{base}/mkdir", json={"path": "/work/data/sub/deeper"})
    ).status_code == 204
    r = await c.post(
        f"{base}/rename", json={"src": "/work/data/blob.bin", "dst": "/work/data/sub/moved.bin"}
    )
    assert r.status_code == 204
    names = {
        e["name"]: e["type"]
        for e in (await c.get(f"{base}/list", params={"path": "/work/data/sub"})).json()["entries"]
    }
    assert names == {"deeper": "dir", "moved.bin": "file"}
    # a name that is not UTF-8 in the guest is listed with U+FFFD (not a 500)
    r = await c.post(f"/v1/sandboxes/{sbx}/exec",
                     json={"cmd": ["python3", "-c", "open(b'/work/data/sub/\\xff.bin', 'w')"]})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    r = await c.get(f"{base}/list", params={"path": "/work/data/sub"})
    assert r.status_code == 200, r.text
    assert "\ufffd.bin" in {e["name"] for e in r.json()["entries"]}
    assert_envelope(await c.get(base, params={"path": "/work/data/blob.bin"}), 404, "not_found")
    assert_envelope(await c.get(f"{base}/list", params={"path": "/nope"}), 404)
    assert_envelope(await c.delete(base, params={"path": "/work/data/sub"}), 409, "conflict")
    assert (
        await c.delete(base, params={"path": "/work/data", "recursive": "true"})
    ).status_code == 204
    assert_envelope(await c.get(f"{base}/stat", params={"path": "/work/data"}), 404)
    r = await c.put(base, params={"path": "/work/step.py"}, content=b"print(6*7)\n")
    assert r.status_code == 200
    assert (await exec_(api, sbx, cmd="python /work/step.py"))["stdout"] == "42\n"


async def test_processes(api: Api, sbx: str) -> None:
    c = api.client
    base = f"/v1/sandboxes/{sbx}/processes"
    r = await c.post(base, json={"cmd": "cat; echo done"})
    assert r.status_code == 201, r.text
    pid = r.json()["pid"]
    assert pid in [p["pid"] for p in (await c.get(base)).json()["processes"]]
    assert (await c.post(f"{base}/{pid}/stdin", content=b"hi there\n")).status_code == 204
    assert (await c.post(f"{base}/{pid}/stdin", params={"eof": "true"})).status_code == 204
    r = await c.post(f"{base}/{pid}/wait", params={"timeout_seconds": 30})
    assert r.status_code == 200, r.text
    assert (r.json()["exit_code"], r.json()["stdout"]) == (0, "hi there\ndone\n")

    r = await c.post(base, json={"cmd": ["sleep", "300"]})
    pid = r.json()["pid"]
    assert_envelope(
        await c.post(f"{base}/{pid}/wait", params={"timeout_seconds": 0.5}), 408, "timeout"
    )
    assert (await c.post(f"{base}/{pid}/signal", json={"signal": 15})).status_code == 204
    r = await c.post(f"{base}/{pid}/wait", params={"timeout_seconds": 30})
    assert r.status_code == 200 and r.json()["signal"] == 15
    assert_envelope(await c.post(f"{base}/999999/signal", json={"signal": 15}), 404)


async def test_lifecycle_and_logs(api: Api, sbx: str) -> None:
    c = api.client
    lc = (await c.get(f"/v1/sandboxes/{sbx}/lifecycle")).json()
    assert lc["state"] == "running" and lc["idle_timeout_seconds"] == 600
    r = await c.patch(f"/v1/sandboxes/{sbx}/lifecycle", json={"ttl_seconds": 7200})
    assert r.json()["expires_at"] == pytest.approx(lc["created_at"] + 7200)
    r = await c.patch(f"/v1/sandboxes/{sbx}/lifecycle", json={"persistent": True})
    assert r.json()["persistent"] is True and r.json()["expires_at"] is None
    logs = (await c.get(f"/v1/sandboxes/{sbx}/logs")).json()
    assert set(logs) == {"console", "agent"} and isinstance(logs["console"], str)


async def test_auth_and_teams(api: Api, sbx: str) -> None:
    c = api.client
    other = await api.new_key("vm-other-team")
    assert_envelope(
        await c.post(f"/v1/sandboxes/{sbx}/exec", json={"cmd": "true"}, headers=api.headers(other)),
        404,
        "not_found",
    )
    assert_envelope(await c.get(f"/v1/sandboxes/{sbx}", headers={"Authorization": ""}), 401)


async def _until_gone(workdir: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while workdir.exists() or qemu_pids_under(workdir):
        assert time.monotonic() < deadline, f"{workdir} or its VM is still there"
        await asyncio.sleep(0.05)


async def test_ttl_expiry_removes_the_vm(api: Api) -> None:
    r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 2})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    state_dir = api.app.state.settings.state_dir
    assert (state_dir / sid).is_dir()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = (await api.client.get(f"/v1/sandboxes/{sid}")).json()
        if info["state"] != "running":
            break
        await asyncio.sleep(0.2)
    assert info["state"] == "expired" and info["end_reason"]
    # The row is marked ended first (no new request may use it), then the VM is removed.
    await _until_gone(state_dir / sid)
    assert_envelope(
        await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}), 409, "conflict"
    )


async def test_idle_reaper(host_mode: str) -> None:
    async with vm_app(host_mode, idle_timeout_seconds=2) as api:
        c = api.client
        # persistent: exempt from the idle reaper and from its (short) TTL alike. Made first,
        # so that once the idle one is reaped both rules would have ended this one too.
        r = await c.post("/v1/sandboxes", json={"persistent": True, "ttl_seconds": 1})
        keep = r.json()["id"]
        idle = (await c.post("/v1/sandboxes", json={})).json()["id"]
        deadline = time.monotonic() + 60  # until reaped, not a fixed 3.5 s
        while True:
            states = {
                s["id"]: s["state"] for s in (await c.get("/v1/sandboxes")).json()["sandboxes"]
            }
            if states[idle] != "running" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert states == {idle: "reaped", keep: "running"}
        state_dir = api.app.state.settings.state_dir
        await _until_gone(state_dir / idle)
        r = await c.post(f"/v1/sandboxes/{keep}/exec", json={"cmd": "echo alive"})
        assert r.json()["stdout"] == "alive\n"
        assert (await c.delete(f"/v1/sandboxes/{keep}")).status_code == 204


async def test_restart_adopts_running_sandbox(host_mode: str) -> None:
    """A restarted server (in-process: with a new runtime in it, which re-adopts the VM; with
    an agent: the agent and its VM untouched) finds the sandbox as it was."""
    async with vm_host(host_mode) as host:
        settings = host.settings
        async with running_app(settings) as api:
            r = await api.client.post("/v1/sandboxes", json={"env": {"K": "v"}})
            sid = r.json()["id"]
            await api.client.put(
                f"/v1/sandboxes/{sid}/files", params={"path": "/work/x"}, content=b"kept"
            )
        async with running_app(settings) as api:  # same DB, same state dir
            info = (await api.client.get(f"/v1/sandboxes/{sid}")).json()
            assert info["state"] == "running"
            r = await api.client.post(
                f"/v1/sandboxes/{sid}/exec", json={"cmd": "cat /work/x; echo $K"}
            )
            assert r.status_code == 200 and r.json()["stdout"] == "keptv\n"
            assert (await api.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
