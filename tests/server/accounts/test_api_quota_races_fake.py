"""Quota admission under concurrency (issue 33), through the HTTP layer over the in-memory
runtime, on SQLite and PostgreSQL: N parallel requests that each add to what a team holds
never leave it over its quota. The runtime's host calls wait at a gate until every request
has either reached its host call or been answered, so each check runs while the others'
host calls are still under way: the window in which a check that is not a reservation lets
them all through. The same race on real VMs: tests/e2e/test_sdk_usage.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from pandastack.hostport.errors import HostError
from pandastack.hostport.results import ForkChildren, SnapshotResult
from pandastack.hostport.volumes import HostVolume, VolumeBackup
from pandastack.server.sandboxes.lifecycle import sweep
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.store import Sandbox
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime, FakeSandbox

DEADLINE = 60.0


class Gate:
    """Host calls wait here until the test opens it; `entered` counts those that arrived."""

    def __init__(self) -> None:
        self.entered = 0
        self.opened = asyncio.Event()

    async def passing(self) -> None:
        self.entered += 1
        await asyncio.wait_for(self.opened.wait(), DEADLINE)


class GatedRuntime(FakeRuntime):
    """The fake host, whose calls named in `gated` wait at `gate`."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = Gate()
        self.gated: set[str] = set()
        self.backups: set[str] = set()

    async def _at_gate(self, name: str) -> None:
        if name in self.gated:
            await self.gate.passing()

    async def wake(self, sandbox_id: str) -> None:
        await self._at_gate("wake")
        await super().wake(sandbox_id)

    async def hibernate(self, sandbox_id: str) -> None:
        await self._at_gate("hibernate")
        await super().hibernate(sandbox_id)

    async def resize_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        await self._at_gate("resize_volume")
        return await super().resize_volume(volume_id, size_mb)

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult:
        await self._at_gate("snapshot")
        return await super().snapshot(sandbox_id, name, internal=internal)

    async def fork(self, sandbox_id: str, count: int = 1) -> ForkChildren[FakeSandbox]:
        await self._at_gate("fork")
        return await super().fork(sandbox_id, count)

    # Volume backups as a host with an object store makes them, 1 MiB stored each.
    async def backup_volume(self, volume_id: str, backup_id: str) -> VolumeBackup:
        vol = self.volume(volume_id)
        await self._at_gate("backup_volume")
        self.backups.add(backup_id)
        return VolumeBackup(backup_id, volume_id, vol.size_mb, 1 << 20, time.time())

    async def delete_volume_backup(self, backup_id: str) -> None:
        self.backups.discard(backup_id)


async def racing(gate: Gate, calls: list[Callable[[], Coroutine[Any, Any, httpx.Response]]]
                 ) -> list[httpx.Response]:
    """Run `calls` at once; open `gate` once each has reached it or been answered."""
    tasks = [asyncio.create_task(call()) for call in calls]
    deadline = time.monotonic() + DEADLINE
    while gate.entered + sum(t.done() for t in tasks) < len(tasks):
        assert time.monotonic() < deadline, "the requests neither reached the host nor ended"
        await asyncio.sleep(0.01)
    gate.opened.set()
    return list(await asyncio.gather(*tasks))


def statuses(answers: list[httpx.Response]) -> list[int]:
    for r in answers:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "quota_exceeded", r.text
    return sorted(r.status_code for r in answers)


async def setup(api: Api, team: str, quota: dict[str, float]) -> dict[str, str]:
    r = await api.client.put(f"/v1/teams/{team}/quota", json=quota)
    assert r.status_code == 200, r.text
    return api.headers(await api.new_key(team))


async def make(api: Api, h: dict[str, str], **body: object) -> str:
    r = await api.client.post("/v1/sandboxes", json={"persistent": True, **body}, headers=h)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def state(api: Api, h: dict[str, str], sid: str) -> str:
    return str((await api.client.get(f"/v1/sandboxes/{sid}", headers=h)).json()["state"])


async def quota_use(api: Api, team: str) -> dict[str, float]:
    use: dict[str, float] = (await api.client.get(f"/v1/teams/{team}/quota")).json()["usage"]
    return use


@pytest.fixture
def runtime(tmp_path: Path) -> GatedRuntime:
    return GatedRuntime(tmp_path)


@pytest.fixture
async def api(tmp_path: Path, db: str, runtime: GatedRuntime) -> AsyncIterator[Api]:
    settings = make_settings(tmp_path, db_url=db, reaper_interval_seconds=3600)
    async with running_app(settings, runtime) as a:
        yield a


async def test_four_wakes_under_max_sandboxes_2(api: Api, runtime: GatedRuntime) -> None:
    h = await setup(api, "w", {"max_sandboxes": 2})
    ids: list[str] = []
    for _ in range(2):  # two, hibernated, then two more: four hibernated under a quota of 2
        pair = [await make(api, h) for _ in range(2)]
        for sid in pair:
            runtime.sandbox(sid).files["/work/f"] = sid.encode()
            r = await api.client.post(f"/v1/sandboxes/{sid}/hibernate", headers=h)
            assert r.status_code == 200, r.text
        ids += pair
    runtime.gated = {"wake"}
    answers = await racing(runtime.gate, [
        lambda sid=sid: api.client.post(f"/v1/sandboxes/{sid}/exec",  # type: ignore[misc]
                                        json={"cmd": "true"}, headers=h)
        for sid in ids])
    assert statuses(answers) == [200, 200, 429, 429]
    states = {sid: await state(api, h, sid) for sid in ids}
    assert sorted(states.values()) == ["hibernated", "hibernated", "running", "running"]
    assert (await quota_use(api, "w"))["sandboxes"] == 2
    for sid, st in states.items():  # the refused stay as they were, files and all
        assert runtime.sandbox(sid).state == st
        assert runtime.sandbox(sid).files["/work/f"] == sid.encode()


async def test_a_failed_wake_gives_its_reservation_back(api: Api,
                                                         runtime: GatedRuntime) -> None:
    h = await setup(api, "f", {"max_sandboxes": 1})
    sid = await make(api, h)
    assert (await api.client.post(f"/v1/sandboxes/{sid}/hibernate", headers=h)).is_success
    runtime.fail_wake = HostError("the host could not restore it")
    r = await api.client.post(f"/v1/sandboxes/{sid}/wake", headers=h)
    assert not r.is_success, r.text
    assert (await quota_use(api, "f"))["sandboxes"] == 0  # not held by the failed wake
    runtime.fail_wake = None
    r = await api.client.post(f"/v1/sandboxes/{sid}/wake", headers=h)
    assert r.status_code == 200 and r.json()["state"] == "running", r.text


async def test_four_restarts_under_max_sandboxes_2(api: Api, runtime: GatedRuntime) -> None:
    h = await setup(api, "r", {"max_sandboxes": 2})
    ids = [await make(api, h) for _ in range(2)]
    for sid in ids:
        runtime.sandbox(sid).alive = False
    service: SandboxService = api.app.state.service
    await sweep(service)
    ids += [await make(api, h) for _ in range(2)]
    for sid in ids[2:]:
        runtime.sandbox(sid).alive = False
    await sweep(service)
    assert [await state(api, h, sid) for sid in ids] == ["stopped"] * 4
    runtime.gated = {"wake"}  # a stopped sandbox's disk boots through the host's wake
    answers = await racing(runtime.gate, [
        lambda sid=sid: api.client.post(f"/v1/sandboxes/{sid}/wake",  # type: ignore[misc]
                                        headers=h)
        for sid in ids])
    assert statuses(answers) == [200, 200, 429, 429]
    assert sorted([await state(api, h, sid) for sid in ids]) == [
        "running", "running", "stopped", "stopped"]


async def test_four_resizes_under_max_volume_gb(api: Api, runtime: GatedRuntime) -> None:
    h = await setup(api, "v", {"max_volume_gb": 1})
    for i in range(4):
        r = await api.client.post("/v1/volumes", json={"name": f"v{i}", "size_mb": 128},
                                  headers=h)
        assert r.status_code == 201, r.text
    runtime.gated = {"resize_volume"}
    # 512 MiB held; each grows by 256: room for two
    answers = await racing(runtime.gate, [
        lambda i=i: api.client.post(f"/v1/volumes/v{i}/resize",  # type: ignore[misc]
                                    json={"size_mb": 384}, headers=h)
        for i in range(4)])
    assert statuses(answers) == [200, 200, 429, 429]
    assert (await quota_use(api, "v"))["volume_gb"] == 1.0
    sizes = sorted(v.size_mb for v in runtime.volumes.values())
    assert sizes == [128, 128, 384, 384]  # the refused were not grown on the host either


async def test_three_hibernates_under_max_hibernated_1(api: Api,
                                                       runtime: GatedRuntime) -> None:
    h = await setup(api, "h", {"max_hibernated": 1})
    ids = [await make(api, h) for _ in range(3)]
    runtime.gated = {"hibernate"}
    answers = await racing(runtime.gate, [
        lambda sid=sid: api.client.post(f"/v1/sandboxes/{sid}/hibernate",  # type: ignore[misc]
                                        headers=h)
        for sid in ids])
    assert statuses(answers) == [200, 429, 429]
    assert sorted([await state(api, h, sid) for sid in ids]) == [
        "hibernated", "running", "running"]
    use = await quota_use(api, "h")
    assert (use["hibernated"], use["sandboxes"]) == (1, 2)
    body = next(r for r in answers if r.status_code == 429).json()["error"]
    assert (body["limit"], body["value"], body["current"]) == ("max_hibernated", 1, 1)


async def test_four_snapshots_under_max_snapshot_gb(api: Api, runtime: GatedRuntime) -> None:
    # The fake host's snapshots store 4096 bytes each: room for two.
    h = await setup(api, "s", {"max_snapshot_gb": 2 * 4096 / (1 << 30)})
    ids = [await make(api, h) for _ in range(4)]
    runtime.gated = {"snapshot"}
    answers = await racing(runtime.gate, [
        lambda sid=sid: api.client.post(f"/v1/sandboxes/{sid}/snapshots",  # type: ignore[misc]
                                        json={}, headers=h)
        for sid in ids])
    assert statuses(answers) == [201, 201, 429, 429]
    listed = (await api.client.get("/v1/snapshots", headers=h)).json()["snapshots"]
    assert len(listed) == 2
    assert len(runtime.snapshots.infos) == 2  # the refused ones' files went again
    r = await api.client.post(f"/v1/sandboxes/{ids[0]}/snapshots", json={}, headers=h)
    assert r.status_code == 429 and r.json()["error"]["limit"] == "max_snapshot_gb", r.text


async def test_four_volume_snapshots_under_max_snapshot_gb(api: Api,
                                                           runtime: GatedRuntime) -> None:
    # Sandbox and volume snapshots count together: one sandbox snapshot (4096 bytes) and
    # room for two volume snapshots of 1 MiB.
    h = await setup(api, "vs", {"max_snapshot_gb": (4096 + 2 * (1 << 20)) / (1 << 30)})
    sid = await make(api, h)
    r = await api.client.post(f"/v1/sandboxes/{sid}/snapshots", json={}, headers=h)
    assert r.status_code == 201, r.text
    for i in range(4):
        r = await api.client.post("/v1/volumes", json={"name": f"d{i}", "size_mb": 64},
                                  headers=h)
        assert r.status_code == 201, r.text
    runtime.gated = {"backup_volume"}
    answers = await racing(runtime.gate, [
        lambda i=i: api.client.post(f"/v1/volumes/d{i}/snapshots",  # type: ignore[misc]
                                    json={}, headers=h)
        for i in range(4)])
    assert statuses(answers) == [201, 201, 429, 429]
    assert len(runtime.backups) == 2  # the refused ones' backups went again
    use = await quota_use(api, "vs")
    assert use["snapshot_gb"] == round((4096 + 2 * (1 << 20)) / (1 << 30), 6)


async def test_parallel_creates_forks_and_volume_creates_stay_within_quota(
        api: Api, runtime: GatedRuntime) -> None:
    h = await setup(api, "c", {"max_sandboxes": 3, "max_volume_gb": 1})
    answers = await racing(runtime.gate, [
        lambda: api.client.post("/v1/sandboxes", json={}, headers=h) for _ in range(4)])
    assert statuses(answers) == [201, 201, 201, 429]
    parent = next(r.json()["id"] for r in answers if r.status_code == 201)
    for r in answers:  # one left for the forks' race
        if r.status_code == 201 and r.json()["id"] != parent:
            await api.client.delete(f"/v1/sandboxes/{r.json()['id']}", headers=h)
            break
    runtime.gated = {"fork"}
    runtime.gate = Gate()
    answers = await racing(runtime.gate, [
        lambda: api.client.post(f"/v1/sandboxes/{parent}/fork", json={"count": 1},
                                headers=h) for _ in range(3)])
    assert [r.status_code for r in answers].count(429) == 2, [r.text for r in answers]
    assert (await quota_use(api, "c"))["sandboxes"] == 3
    answers = await racing(runtime.gate, [
        lambda i=i: api.client.post("/v1/volumes",  # type: ignore[misc]
                                    json={"name": f"n{i}", "size_mb": 512}, headers=h)
        for i in range(4)])
    assert statuses(answers) == [201, 201, 429, 429]
    assert (await quota_use(api, "c"))["volume_gb"] == 1.0


async def test_a_hold_left_by_a_killed_server_goes_with_the_next_wake_or_hibernate(
        api: Api, runtime: GatedRuntime) -> None:
    h = await setup(api, "k", {"max_sandboxes": 2, "max_hibernated": 1})
    asleep, awake = await make(api, h), await make(api, h)
    assert (await api.client.post(f"/v1/sandboxes/{asleep}/hibernate", headers=h)).is_success
    service: SandboxService = api.app.state.service
    with service.store.session() as s:  # as a server killed in the middle of each leaves it
        s.execute(update(Sandbox).where(Sandbox.id == asleep).values(quota_hold="awake"))
        s.execute(update(Sandbox).where(Sandbox.id == awake).values(quota_hold="awake"))
    assert (await quota_use(api, "k"))["sandboxes"] == 2  # the stale hold counts
    r = await api.client.post(f"/v1/sandboxes/{asleep}/wake", headers=h)
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    # The other's stale "awake" is replaced by the hibernate's own hold, checked: the limit
    # of one hibernated sandbox has room (the woken one is not hibernated any more).
    r = await api.client.post(f"/v1/sandboxes/{awake}/hibernate", headers=h)
    assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
    with service.store.session() as s:
        holds = s.scalars(select(Sandbox.quota_hold).where(Sandbox.team == "k")).all()
    assert list(holds) == [None, None]
    use = await quota_use(api, "k")
    assert (use["sandboxes"], use["hibernated"]) == (1, 1)
    r = await api.client.post(f"/v1/sandboxes/{asleep}/hibernate", headers=h)
    assert r.status_code == 429 and r.json()["error"]["limit"] == "max_hibernated", r.text
