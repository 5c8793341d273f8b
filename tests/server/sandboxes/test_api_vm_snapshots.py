"""Fork, snapshots and hibernation through the REST API, on real microVMs: a parent, a fork of
two, one sandbox restored from a snapshot, and hibernate/wake on one of them (four VMs). The
app runs over each host mode (tests/server/vm_app.py) with a private state dir and a private
snapshot dir, so the test can assert that nothing (no VM, no layer file) is left behind."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.helpers import qemu_pids_under
from tests.server.conftest import Api, assert_envelope
from tests.server.vm_app import vm_app

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
async def api(host_mode: str) -> AsyncIterator[Api]:
    async with vm_app(host_mode) as a:
        yield a
        for row in (await a.client.get("/v1/sandboxes")).json()["sandboxes"]:
            await a.client.delete(f"/v1/sandboxes/{row['id']}")
        for snap in (await a.client.get("/v1/snapshots")).json()["snapshots"]:
            await a.client.delete(f"/v1/snapshots/{snap['id']}")


async def exec_out(api: Api, sid: object, cmd: str) -> str:
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd})
    assert r.status_code == 200, r.text
    assert r.json()["exit_code"] == 0, r.text
    return str(r.json()["stdout"])


async def state_of(api: Api, sid: object) -> str:
    return str((await api.client.get(f"/v1/sandboxes/{sid}")).json()["state"])


async def test_fork_snapshot_hibernate_and_faults(api: Api) -> None:
    c = api.client
    r = await c.post("/v1/sandboxes", json={"ttl_seconds": 600, "env": {"WHO": "family"},
                                             "metadata": {"suite": "fork"}})
    assert r.status_code == 201, r.text
    parent = r.json()["id"]
    r = await c.put(f"/v1/sandboxes/{parent}/files", params={"path": "/work/from-parent"},
                    content=b"parent-data")
    assert r.status_code == 200, r.text

    # fork of two: the parent's file, distinct ids and hostnames, the parent's env and labels
    r = await c.post(f"/v1/sandboxes/{parent}/fork", json={"count": 2})
    assert r.status_code == 201, r.text
    children = [s["id"] for s in r.json()["sandboxes"]]
    assert len(set(children) | {parent}) == 3
    hostnames = {await exec_out(api, parent, "hostname")}
    for child in children:
        info = (await c.get(f"/v1/sandboxes/{child}")).json()
        assert info["state"] == "running" and info["metadata"] == {"suite": "fork"}
        assert await exec_out(api, child, "cat /work/from-parent") == "parent-data"
        assert await exec_out(api, child, "echo $WHO") == "family\n"
        hostnames.add(await exec_out(api, child, "hostname"))
    assert len(hostnames) == 3, hostnames
    await exec_out(api, children[0], "echo mine > /work/only-child-0")
    r = await c.post(f"/v1/sandboxes/{parent}/exec", json={"cmd": "test -e /work/only-child-0"})
    assert r.json()["exit_code"] == 1

    # snapshot -> create from it -> delete the snapshot while its child runs
    r = await c.post(f"/v1/sandboxes/{parent}/snapshots", json={"name": "api-vm"})
    assert r.status_code == 201, r.text
    snap = r.json()
    assert snap["source_sandbox"] == parent and snap["size_bytes"] > 0
    assert [s["id"] for s in (await c.get("/v1/snapshots")).json()["snapshots"]] == [snap["id"]]
    r = await c.post("/v1/sandboxes", json={"snapshot": snap["id"], "ttl_seconds": 600})
    assert r.status_code == 201, r.text
    restored = r.json()["id"]
    assert r.json()["snapshot"] == snap["id"]
    assert await exec_out(api, restored, "cat /work/from-parent") == "parent-data"
    assert (await c.delete(f"/v1/snapshots/{snap['id']}")).status_code == 204
    assert await exec_out(api, restored, "echo alive") == "alive\n"
    assert_envelope(await c.post("/v1/sandboxes", json={"snapshot": snap["id"]}), 404)

    # hibernate: no VM process; any request wakes it, with its files and processes
    pid = (await c.post(f"/v1/sandboxes/{restored}/processes",
                        json={"cmd": "sleep 600"})).json()["pid"]
    r = await c.post(f"/v1/sandboxes/{restored}/hibernate")
    assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
    assert await state_of(api, restored) == "hibernated"
    assert no_vm_process(api, restored)
    assert await exec_out(api, restored, "cat /work/from-parent") == "parent-data"
    assert await state_of(api, restored) == "running"
    procs = (await c.get(f"/v1/sandboxes/{restored}/processes")).json()["processes"]
    assert any(p["pid"] == pid and p["running"] for p in procs), procs
    assert (await c.post(f"/v1/sandboxes/{restored}/hibernate")).json()["state"] == "hibernated"
    assert (await c.post(f"/v1/sandboxes/{restored}/wake")).json()["state"] == "running"

    # pause / resume
    assert (await c.post(f"/v1/sandboxes/{parent}/pause")).json()["state"] == "paused"
    assert_envelope(await c.post(f"/v1/sandboxes/{parent}/exec", json={"cmd": "true"}), 409)
    assert (await c.post(f"/v1/sandboxes/{parent}/resume")).json()["state"] == "running"

    # faults: a killed parent cannot be forked or snapshotted; its children live on
    assert (await c.delete(f"/v1/sandboxes/{parent}")).status_code == 204
    assert_envelope(await c.post(f"/v1/sandboxes/{parent}/fork", json={}), 409, "conflict")
    assert_envelope(await c.post(f"/v1/sandboxes/{parent}/snapshots", json={}), 409)
    assert_envelope(await c.post("/v1/sandboxes/sbx-000000000000/fork", json={}), 404)
    for child in children:
        assert await exec_out(api, child, "cat /work/from-parent") == "parent-data"


def no_vm_process(api: Api, sid: str) -> bool:
    """No QEMU process runs for the sandbox (it is hibernated)."""
    return qemu_pids_under(api.app.state.settings.state_dir / sid) == []
