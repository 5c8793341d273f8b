"""The stopped state (ADR 0037) over the in-memory runtime: which sandboxes a dead VM stops
and which it fails, which source a restart takes (hibernation, then its newest snapshot,
then its disk), what a stopped one answers, and the reconcile at start of dead VMs and of
snapshot files and rows. The same with real VMs: tests/e2e/test_persistent_vm_death.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from pandastack.server.sandboxes.lifecycle import decide, sweep
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.sandboxes.stopped import ORPHAN_SNAPSHOT_GRACE_SECONDS
from pandastack.server.store import Snapshot
from pandastack.server.store.events import Event
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.sandboxes.test_api_snapshots_fake import create, post, state_of


def events(service: SandboxService, sid: str) -> list[tuple[str, dict[str, Any]]]:
    with service.store.session() as s:
        rows = s.scalars(select(Event).where(Event.sandbox_id == sid).order_by(Event.id))
        return [(e.type, dict(e.data)) for e in rows]


async def info(api: Api, sid: str) -> dict[str, Any]:
    r = await api.client.get(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def test_a_stopped_sandbox_expires_only_once_it_is_no_longer_persistent() -> None:
    common: dict[str, Any] = dict(state="stopped", expires_at=10.0, last_activity_at=0.0,
                                  busy=False, now=100.0, idle_timeout=5.0)
    assert decide(persistent=True, **common) is None
    verdict = decide(persistent=False, **common)
    assert verdict is not None and verdict.state == "expired"
    assert decide(persistent=False, **{**common, "now": 5.0}) is None  # not before its TTL


async def test_a_dead_vm_stops_a_persistent_sandbox_and_fails_the_others(
        tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    async with running_app(make_settings(tmp_path, reaper_interval_seconds=3600),
                           runtime) as api:
        service: SandboxService = api.app.state.service
        keep = str((await create(api, persistent=True))["id"])
        plain = str((await create(api))["id"])
        runtime.sandbox(keep).files["/work/f"] = b"kept"
        for sid in (keep, plain):
            runtime.sandbox(sid).alive = False
        assert await sweep(service) == [(plain, "failed")]
        assert plain in runtime.killed and keep not in runtime.killed
        stopped = await info(api, keep)
        assert (stopped["state"], stopped["stop_reason"]) == ("stopped", "VM exited unexpectedly")
        assert stopped["ended_at"] is None
        assert await sweep(service) == []  # stays stopped: nothing to fail, nothing to kill
        # a stopped sandbox has no VM to hibernate, pause or snapshot without starting it
        r = await api.client.post(f"/v1/sandboxes/{keep}/hibernate")
        assert_envelope(r, 409, "conflict")
        # a request that needs the VM starts it again: its disk booted, its files there
        await post(api, f"/v1/sandboxes/{keep}/exec", 200, cmd="true")
        assert runtime.sandbox(keep).boots == 1
        assert runtime.sandbox(keep).files == {"/work/f": b"kept"}
        again = await info(api, keep)
        assert (again["state"], again["restored_from"], again["stop_reason"]) == (
            "running", "disk", None)
        kinds = [(k, d.get("reason"), d.get("restored_from")) for k, d in events(service, keep)]
        assert kinds[-2:] == [("sandbox.stopped", "VM exited unexpectedly", None),
                              ("sandbox.woken", None, "disk")]


async def test_a_restart_takes_its_hibernation_then_its_newest_snapshot_then_its_disk(
        tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    async with running_app(make_settings(tmp_path, reaper_interval_seconds=3600),
                           runtime) as api:
        service: SandboxService = api.app.state.service
        hib, snapped = [str((await create(api, persistent=True))["id"]) for _ in range(2)]
        r = await api.client.patch(f"/v1/sandboxes/{snapped}/network",
                                   json={"internet": False})
        assert r.status_code == 200, r.text
        runtime.sandbox(snapped).files["/work/f"] = b"v1"
        await post(api, f"/v1/sandboxes/{snapped}/snapshots", 201)
        runtime.sandbox(snapped).files["/work/f"] = b"v2"
        for sid in (hib, snapped):
            runtime.sandbox(sid).alive = False
        await sweep(service)
        assert [await state_of(api, s) for s in (hib, snapped)] == ["stopped", "stopped"]
        runtime.sandbox(hib).state = "hibernated"  # its host holds a whole hibernation
        woken = await post(api, f"/v1/sandboxes/{hib}/wake", 200)
        assert woken["restored_from"] == "hibernation"
        assert runtime.sandbox(hib).wakes == 1 and runtime.sandbox(hib).boots == 0
        woken = await post(api, f"/v1/sandboxes/{snapped}/wake", 200)
        assert (woken["state"], woken["restored_from"]) == ("running", "snapshot")
        assert snapped in runtime.killed  # the dead VM's directory made way for the restore
        # the state at that snapshot, with the sandbox's own network policy
        assert runtime.sandbox(snapped).files == {"/work/f": b"v1"}
        assert runtime.sandbox(snapped).network.internet is False


async def test_reconcile_stops_fails_and_removes_what_it_should(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, reaper_interval_seconds=3600)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        kept, snapped, bare = [str((await create(api, persistent=True))["id"])
                               for _ in range(3)]
        plain = str((await create(api))["id"])
        await post(api, f"/v1/sandboxes/{snapped}/snapshots", 201)
        old = str((await post(api, f"/v1/sandboxes/{plain}/snapshots", 201))["id"])
        young = str((await post(api, f"/v1/sandboxes/{plain}/snapshots", 201))["id"])
        lost = str((await post(api, f"/v1/sandboxes/{plain}/snapshots", 201))["id"])
        service: SandboxService = api.app.state.service
    # While the server was down: every VM died; the host lost two disks and one snapshot's
    # files; two snapshots lost their rows (a crash before the row was written), one of
    # them long ago; and another server's snapshot is in the shared directory.
    runtime.sandbox(kept).alive = False
    runtime.sandbox(plain).alive = False
    del runtime.sandboxes[snapped], runtime.sandboxes[bare]
    del runtime.snapshots.infos[lost]
    with service.store.session() as s:
        s.execute(delete(Snapshot).where(Snapshot.id.in_([old, young])))
    infos = runtime.snapshots.infos
    infos[old] = dataclasses.replace(
        infos[old], created_at=time.time() - ORPHAN_SNAPSHOT_GRACE_SECONDS - 60)
    foreign = "snap-0000000000ff"
    infos[foreign] = dataclasses.replace(infos[old], id=foreign, source="sbx-0000000000ff")
    runtime.snapshots.files[foreign] = {}

    async with running_app(settings, runtime) as api:
        assert await state_of(api, kept) == "stopped"  # its disk is on the host
        assert await state_of(api, snapped) == "stopped"  # its snapshot can restore it
        assert (await info(api, bare))["end_reason"] == (
            "its disk is gone from the host (and it has no snapshot)")
        assert await state_of(api, plain) == "failed"
        assert plain in runtime.killed and kept not in runtime.killed
        r = await api.client.get(f"/v1/snapshots/{lost}")
        assert_envelope(r, 404, "not_found")
        assert old not in infos  # no row, older than the grace: removed
        assert young in infos and foreign in infos  # too young; not this database's
        woken = await post(api, f"/v1/sandboxes/{snapped}/wake", 200)
        assert woken["restored_from"] == "snapshot"


async def test_requests_at_once_start_a_stopped_sandbox_once(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    async with running_app(make_settings(tmp_path, reaper_interval_seconds=3600),
                           runtime) as api:
        service: SandboxService = api.app.state.service
        sid = str((await create(api, persistent=True))["id"])
        await post(api, f"/v1/sandboxes/{sid}/snapshots", 201)
        runtime.sandbox(sid).alive = False
        await sweep(service)
        assert await state_of(api, sid) == "stopped"
        replies = await asyncio.gather(*(api.client.post(f"/v1/sandboxes/{sid}/exec",
                                                         json={"cmd": "true"})
                                          for _ in range(3)))
        assert [r.status_code for r in replies] == [200, 200, 200], [r.text for r in replies]
        assert runtime.killed.count(sid) == 1  # one restore from the snapshot, not three
        # a row found stopped whose VM runs after all is only told so: nothing is discarded
        row = service.store.sandbox_by_id(sid)
        assert row is not None
        service.stop_row(row, "a stale look")
        woken = await post(api, f"/v1/sandboxes/{sid}/wake", 200)
        assert woken["state"] == "running" and runtime.killed.count(sid) == 1
