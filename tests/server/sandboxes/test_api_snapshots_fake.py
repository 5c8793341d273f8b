"""Pause/resume, hibernate/wake, snapshots and fork through the HTTP layer, over the in-memory
runtime: every route, the state bookkeeping, the error mapping and team isolation. Fast."""

from __future__ import annotations

import errno
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.hostport.errors import AgentConnectionError, SandboxStateError, SnapshotFailed
from pandastack.server.sandboxes.lifecycle import decide, should_hibernate, sweep
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.settings import Settings
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path)) as a:
        yield a


def runtime_of(api: Api) -> FakeRuntime:
    service: SandboxService = api.app.state.service
    assert isinstance(service.runtime, FakeRuntime)
    return service.runtime


async def create(api: Api, key: str | None = None, **body: object) -> dict[str, object]:
    r = await api.client.post("/v1/sandboxes", json=body, headers=api.headers(key))
    assert r.status_code == 201, r.text
    data: dict[str, object] = r.json()
    return data


async def state_of(api: Api, sid: object) -> str:
    r = await api.client.get(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


async def post(api: Api, path: str, status: int, **body: object) -> dict[str, object]:
    r = await api.client.post(path, json=body)
    assert r.status_code == status, (r.status_code, r.text)
    data: dict[str, object] = r.json()
    return data


async def test_pause_and_resume(api: Api) -> None:
    sid = (await create(api))["id"]
    assert (await post(api, f"/v1/sandboxes/{sid}/pause", 200))["state"] == "paused"
    assert await state_of(api, sid) == "paused"
    assert runtime_of(api).sandbox(str(sid)).state == "paused"
    assert (await post(api, f"/v1/sandboxes/{sid}/pause", 200))["state"] == "paused"  # again
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
    assert_envelope(r, 409, "conflict")
    assert_envelope(await api.client.get(f"/v1/sandboxes/{sid}/files", params={"path": "/a"}),
                    409, "conflict")
    assert (await post(api, f"/v1/sandboxes/{sid}/resume", 200))["state"] == "running"
    assert (await post(api, f"/v1/sandboxes/{sid}/resume", 200))["state"] == "running"
    await post(api, f"/v1/sandboxes/{sid}/exec", 200, cmd="true")


async def test_hibernate_then_any_request_wakes(api: Api) -> None:
    rt = runtime_of(api)
    sid = str((await create(api))["id"])
    await api.client.put(f"/v1/sandboxes/{sid}/files", params={"path": "/w/a"}, content=b"x")
    requests = [
        ("POST", f"/v1/sandboxes/{sid}/exec", {"json": {"cmd": "true"}}, 200),
        ("GET", f"/v1/sandboxes/{sid}/files", {"params": {"path": "/w/a"}}, 200),
        ("GET", f"/v1/sandboxes/{sid}/files/stat", {"params": {"path": "/w/a"}}, 200),
        ("GET", f"/v1/sandboxes/{sid}/processes", {}, 200),
        ("POST", f"/v1/sandboxes/{sid}/processes", {"json": {"cmd": "sleep 9"}}, 201),
        ("PUT", f"/v1/sandboxes/{sid}/files", {"params": {"path": "/w/b"}, "content": b"y"}, 200),
        ("POST", f"/v1/sandboxes/{sid}/exec/stream", {"json": {"cmd": "true"}}, 200),
    ]
    for n, (method, path, kwargs, status) in enumerate(requests, start=1):
        info = await post(api, f"/v1/sandboxes/{sid}/hibernate", 200)
        assert info["state"] == "hibernated"
        assert await state_of(api, sid) == "hibernated"  # reading the row does not wake it
        assert (await api.client.get(f"/v1/sandboxes/{sid}/lifecycle")).json()["state"] \
            == "hibernated"
        r = await api.client.request(method, path, **kwargs)  # type: ignore[arg-type]
        assert r.status_code == status, (path, r.text)
        assert await state_of(api, sid) == "running", path
        assert rt.sandbox(sid).wakes == n
    # hibernate is idempotent; wake explicitly; wake of a running one is a no-op
    await post(api, f"/v1/sandboxes/{sid}/hibernate", 200)
    assert (await post(api, f"/v1/sandboxes/{sid}/hibernate", 200))["state"] == "hibernated"
    assert (await post(api, f"/v1/sandboxes/{sid}/wake", 200))["state"] == "running"
    assert (await post(api, f"/v1/sandboxes/{sid}/wake", 200))["state"] == "running"
    # pause and resume of a hibernated sandbox wake it first
    await post(api, f"/v1/sandboxes/{sid}/hibernate", 200)
    assert (await post(api, f"/v1/sandboxes/{sid}/pause", 200))["state"] == "paused"
    await post(api, f"/v1/sandboxes/{sid}/hibernate", 200)
    assert (await post(api, f"/v1/sandboxes/{sid}/resume", 200))["state"] == "running"


async def test_a_failed_wake_is_a_clear_error_and_the_row_stays_hibernated(api: Api) -> None:
    rt = runtime_of(api)
    sid = str((await create(api))["id"])
    await post(api, f"/v1/sandboxes/{sid}/hibernate", 200)
    rt.fail_wake = AgentConnectionError("agent did not answer")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}),
                    503, "unavailable")
    assert await state_of(api, sid) == "hibernated"
    rt.fail_wake = None
    await post(api, f"/v1/sandboxes/{sid}/exec", 200, cmd="true")
    assert await state_of(api, sid) == "running"


async def test_snapshot_list_get_create_from_delete(api: Api) -> None:
    rt = runtime_of(api)
    src = await create(api, ttl_seconds=900)
    sid = src["id"]
    await api.client.put(f"/v1/sandboxes/{sid}/files", params={"path": "/w/a"}, content=b"hi")
    snap = await post(api, f"/v1/sandboxes/{sid}/snapshots", 201, name="before-fix")
    assert snap["name"] == "before-fix" and snap["source_sandbox"] == sid
    assert str(snap["id"]).startswith("snap-")
    assert snap["template"] == "base" and snap["vcpus"] == 1 and snap["memory_mb"] == 512
    assert snap["disk_mb"] == 2048 and snap["size_bytes"] == 4096
    unnamed = await post(api, f"/v1/sandboxes/{sid}/snapshots", 201)
    assert unnamed["name"] is None
    listed = (await api.client.get("/v1/snapshots")).json()["snapshots"]
    assert [s["id"] for s in listed] == [snap["id"], unnamed["id"]]
    assert (await api.client.get(f"/v1/snapshots/{snap['id']}")).json() == snap
    assert await state_of(api, sid) == "running"  # the source keeps running
    # create from it, more than once
    for _ in range(2):
        child = await create(api, snapshot=snap["id"], ttl_seconds=60)
        assert child["state"] == "running" and child["snapshot"] == snap["id"]
        assert child["template"] == "base" and child["ttl_seconds"] == 60
        assert rt.sandbox(str(child["id"])).files == {"/w/a": b"hi"}
    # the shape comes from the snapshot: naming the same values is fine, others a 422
    await create(api, snapshot=snap["id"], template="base", vcpus=1, memory_mb=512)
    r = await api.client.post("/v1/sandboxes", json={"snapshot": snap["id"], "vcpus": 2})
    assert_envelope(r, 422, "validation_error")
    assert "vcpus" in r.json()["error"]["message"]
    # delete: 204, then gone everywhere; children keep running
    r = await api.client.delete(f"/v1/snapshots/{snap['id']}")
    assert r.status_code == 204 and r.content == b""
    assert snap["id"] not in rt.snapshots.infos
    assert_envelope(await api.client.get(f"/v1/snapshots/{snap['id']}"), 404, "not_found")
    assert_envelope(await api.client.delete(f"/v1/snapshots/{snap['id']}"), 404, "not_found")
    r = await api.client.post("/v1/sandboxes", json={"snapshot": snap["id"]})
    assert_envelope(r, 404, "not_found")
    assert [s["id"] for s in (await api.client.get("/v1/snapshots")).json()["snapshots"]] \
        == [unnamed["id"]]
    assert await state_of(api, child["id"]) == "running"


async def test_unknown_and_malformed_snapshot_ids_are_404(api: Api) -> None:
    for sid in ("snap-000000000000", "nope", "snap-../../x"):
        assert_envelope(await api.client.get(f"/v1/snapshots/{sid}"), 404, "not_found")
        assert_envelope(await api.client.delete(f"/v1/snapshots/{sid}"), 404, "not_found")
        r = await api.client.post("/v1/sandboxes", json={"snapshot": sid})
        assert_envelope(r, 404, "not_found")
    # a snapshot whose files vanished from the host: 404 on create, the row says why
    sbx = await create(api)
    snap = await post(api, f"/v1/sandboxes/{sbx['id']}/snapshots", 201)
    del runtime_of(api).snapshots.infos[str(snap["id"])]
    r = await api.client.post("/v1/sandboxes", json={"snapshot": snap["id"]})
    assert_envelope(r, 404, "not_found")
    assert (await api.client.delete(f"/v1/snapshots/{snap['id']}")).status_code == 204


async def test_snapshots_belong_to_the_team(api: Api) -> None:
    key_b = await api.new_key("team-b", "b")
    mine = await create(api)
    snap = await post(api, f"/v1/sandboxes/{mine['id']}/snapshots", 201, name="a")
    c, hb = api.client, api.headers(key_b)
    assert (await c.get("/v1/snapshots", headers=hb)).json() == {"snapshots": []}
    assert_envelope(await c.get(f"/v1/snapshots/{snap['id']}", headers=hb), 404, "not_found")
    assert_envelope(await c.delete(f"/v1/snapshots/{snap['id']}", headers=hb), 404, "not_found")
    r = await c.post("/v1/sandboxes", json={"snapshot": snap["id"]}, headers=hb)
    assert_envelope(r, 404, "not_found")
    for op, body in (("snapshots", {}), ("fork", {"count": 1}), ("pause", None),
                     ("resume", None), ("hibernate", None), ("wake", None)):
        r = await c.post(f"/v1/sandboxes/{mine['id']}/{op}", json=body, headers=hb)
        assert_envelope(r, 404, "not_found")
    assert await state_of(api, mine["id"]) == "running"
    # team b's own snapshot is invisible to the admin's team
    theirs = await create(api, key_b)
    r = await c.post(f"/v1/sandboxes/{theirs['id']}/snapshots", json={}, headers=hb)
    assert r.status_code == 201
    assert [s["id"] for s in (await c.get("/v1/snapshots")).json()["snapshots"]] == [snap["id"]]
    assert (await c.get(f"/v1/snapshots/{snap['id']}")).status_code == 200


async def test_fork(api: Api) -> None:
    rt = runtime_of(api)
    parent = await create(api, ttl_seconds=1234, persistent=True, env={"A": "1"},
                          metadata={"run": "7"})
    pid = str(parent["id"])
    await api.client.put(f"/v1/sandboxes/{pid}/files", params={"path": "/w/a"}, content=b"p")
    result = await post(api, f"/v1/sandboxes/{pid}/fork", 201, count=3)
    assert result["parent"] == pid and isinstance(result["duration_ms"], float)
    assert result["parent_pause_ms"] == 1.5  # the host's pause for the fork's snapshot
    children = result["sandboxes"]
    assert isinstance(children, list) and len(children) == 3
    ids = {c["id"] for c in children}
    assert len(ids) == 3 and pid not in ids
    for child in children:
        assert child["state"] == "running" and child["snapshot"] is None
        assert child["ttl_seconds"] == 1234 and child["persistent"] is True
        assert child["metadata"] == {"run": "7"} and child["template"] == "base"
        assert rt.sandbox(child["id"]).files == {"/w/a": b"p"}
        await post(api, f"/v1/sandboxes/{child['id']}/exec", 200, cmd="true")
        assert rt.sandbox(child["id"]).last_env == {"A": "1"}
    listed = (await api.client.get("/v1/sandboxes", params={"metadata.run": "7"})).json()
    assert {s["id"] for s in listed["sandboxes"]} == ids | {pid}
    assert rt.snapshots.all(include_internal=True) == []  # the fork's snapshot is gone
    # the default count is 1; the parent keeps running
    one = (await post(api, f"/v1/sandboxes/{pid}/fork", 201))["sandboxes"]
    assert isinstance(one, list) and len(one) == 1
    assert await state_of(api, pid) == "running"
    # a hibernated parent is woken and forked
    await post(api, f"/v1/sandboxes/{pid}/hibernate", 200)
    await post(api, f"/v1/sandboxes/{pid}/fork", 201, count=1)
    assert await state_of(api, pid) == "running"


async def test_fork_and_snapshot_errors(api: Api) -> None:
    rt = runtime_of(api)
    sid = str((await create(api))["id"])
    for count in (0, 17, -1, 1.5, None, "many"):
        r = await api.client.post(f"/v1/sandboxes/{sid}/fork", json={"count": count})
        assert_envelope(r, 422, "validation_error")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}), 422)
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/snapshots",
                                          json={"name": "x" * 129}), 422)
    # the runtime's failures
    rt.fail_snapshot = SnapshotFailed("migration failed", disk_switched=False, no_space=True)
    r = await api.client.post(f"/v1/sandboxes/{sid}/snapshots", json={})
    assert_envelope(r, 507, "insufficient_storage")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/fork", json={}), 507)
    rt.fail_snapshot = SnapshotFailed("qemu went away", disk_switched=False)
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/snapshots", json={}), 503,
                    "unavailable")
    rt.fail_snapshot = SandboxStateError(f"sandbox {sid} is hibernated")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/snapshots", json={}), 409,
                    "conflict")
    rt.fail_snapshot = None
    rt.fail_fork = ValueError("count must be between 1 and 16")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/fork", json={}), 422,
                    "validation_error")
    rt.fail_fork = OSError(errno.ENOSPC, "No space left on device")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/fork", json={}), 507,
                    "insufficient_storage")
    rt.fail_fork = OSError(errno.EIO, "Input/output error")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/fork", json={}), 503,
                    "unavailable")
    rt.fail_fork = None
    assert await state_of(api, sid) == "running"
    assert (await api.client.get("/v1/snapshots")).json() == {"snapshots": []}
    # ended and unknown sandboxes
    assert (await api.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    for op in ("fork", "snapshots", "pause", "resume", "hibernate", "wake"):
        r = await api.client.post(f"/v1/sandboxes/{sid}/{op}", json={})
        assert_envelope(r, 409, "conflict")
        r = await api.client.post(f"/v1/sandboxes/sbx-000000000000/{op}", json={})
        assert_envelope(r, 404, "not_found")


async def test_reconcile_keeps_the_runtime_state(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        hib = str((await create(api))["id"])
        paused = str((await create(api))["id"])
        woke = str((await create(api))["id"])
        snap = await post(api, f"/v1/sandboxes/{hib}/snapshots", 201)
        lost = await post(api, f"/v1/sandboxes/{woke}/snapshots", 201)
        await post(api, f"/v1/sandboxes/{hib}/hibernate", 200)
        await post(api, f"/v1/sandboxes/{woke}/hibernate", 200)
    # while the server was down: one paused, one woken, one snapshot's files gone
    runtime.sandbox(paused).state = "paused"
    runtime.sandbox(woke).state = "running"
    del runtime.snapshots.infos[str(lost["id"])]
    async with running_app(settings, runtime) as api:
        assert await state_of(api, hib) == "hibernated"
        assert await state_of(api, paused) == "paused"
        assert await state_of(api, woke) == "running"
        assert hib not in runtime.killed
        ids = [s["id"] for s in (await api.client.get("/v1/snapshots")).json()["snapshots"]]
        assert ids == [snap["id"]]


async def test_idle_policy_hibernates_persistent_sandboxes(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, idle_timeout_seconds=100, hibernate_idle_seconds=10,
                             reaper_interval_seconds=3600)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        service: SandboxService = api.app.state.service
        keep = str((await create(api, persistent=True))["id"])
        plain = str((await create(api, ttl_seconds=1000))["id"])
        hib = str((await create(api, ttl_seconds=50))["id"])
        await post(api, f"/v1/sandboxes/{hib}/hibernate", 200)
        base = time.time()
        assert await sweep(service, now=base + 5) == []
        assert await sweep(service, now=base + 20) == []
        assert await state_of(api, keep) == "hibernated"  # persistent and idle: hibernated
        assert runtime.sandbox(keep).state == "hibernated"
        assert await state_of(api, plain) == "running"  # not persistent: left to the reaper
        assert await state_of(api, hib) == "hibernated"
        # hibernated persistent sandboxes are never reaped; a hibernated one still expires
        ended = dict(await sweep(service, now=base + 500))
        assert ended == {plain: "reaped", hib: "expired"}
        assert await state_of(api, keep) == "hibernated"
        assert hib in runtime.killed
        # a request wakes it
        await post(api, f"/v1/sandboxes/{keep}/exec", 200, cmd="true")
        assert await state_of(api, keep) == "running"


async def test_sweep_follows_the_runtime_and_spares_transitions(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, reaper_interval_seconds=3600)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        service: SandboxService = api.app.state.service
        sid = str((await create(api, ttl_seconds=1000))["id"])
        runtime.sandbox(sid).state = "hibernated"  # e.g. woken or hibernated behind our back
        assert await sweep(service) == []
        assert await state_of(api, sid) == "hibernated"
        runtime.sandbox(sid).state = "running"
        runtime.sandbox(sid).alive = False
        async with service.transition(sid):
            assert await sweep(service) == []  # a VM briefly gone mid-change is not a failure
        assert await sweep(service) == [(sid, "failed")]


def test_policy_decisions() -> None:
    def verdict(state: str, now: float, persistent: bool = False) -> str | None:
        v = decide(state=state, persistent=persistent, expires_at=100.0, last_activity_at=0.0,
                   busy=False, now=now, idle_timeout=60.0)
        return None if v is None else v.state

    assert verdict("hibernated", 70.0) is None  # no idle reaping of a hibernated sandbox
    assert verdict("hibernated", 100.0) == "expired"  # but the TTL holds
    assert verdict("paused", 70.0) == "reaped"
    assert verdict("hibernated", 1e9, persistent=True) is None

    def hibernate(state: str = "running", persistent: bool = True, busy: bool = False,
                  after: float | None = 20) -> bool:
        return should_hibernate(state=state, persistent=persistent, last_activity_at=0.0,
                                busy=busy, now=30.0, hibernate_idle=after)

    assert hibernate()
    assert not hibernate(after=None)
    assert not hibernate(persistent=False)
    assert not hibernate(state="paused")
    assert not hibernate(after=40)
    assert not hibernate(busy=True)


def test_hibernate_idle_setting() -> None:
    assert Settings.from_env({}).hibernate_idle_seconds is None
    assert Settings.from_env({"PANDASTACK_HIBERNATE_IDLE": "900"}).hibernate_idle_seconds == 900
    assert Settings.from_env({"PANDASTACK_HIBERNATE_IDLE": "off"}).hibernate_idle_seconds is None
    with pytest.raises(ValueError, match="PANDASTACK_HIBERNATE_IDLE"):
        Settings.from_env({"PANDASTACK_HIBERNATE_IDLE": "soon"})
    with pytest.raises(ValueError):
        Settings(hibernate_idle_seconds=-5)


async def test_a_sweep_lists_the_host_once_instead_of_a_lookup_per_sandbox(
        tmp_path: Path) -> None:
    """With an agent each lookup is a round trip: healthy sandboxes in the state their rows
    say cost none; one that differs is still looked up on its own (and followed)."""
    settings = make_settings(tmp_path, reaper_interval_seconds=3600)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        service: SandboxService = api.app.state.service
        sids = [str((await create(api, ttl_seconds=1000))["id"]) for _ in range(3)]
        looked_up: list[str] = []
        get = runtime.get

        async def counting_get(sandbox_id: str) -> object:
            looked_up.append(sandbox_id)
            return await get(sandbox_id)

        runtime.get = counting_get  # type: ignore[assignment,method-assign]
        assert await sweep(service) == []
        assert looked_up == []
        runtime.sandbox(sids[1]).state = "paused"  # changed behind the store's back
        assert await sweep(service) == []
        assert set(looked_up) == {sids[1]}
        assert await state_of(api, sids[1]) == "paused"
