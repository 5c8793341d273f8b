"""Volumes in the store, on real SQLite and a real PostgreSQL (the `db` fixture): the one-writer
rule checked in the transaction that inserts the sandbox's row (also when two servers race for
the writer), attachments dropped by every path that ends a sandbox and kept by hibernation,
fork children's copies and what a snapshot records."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from pandastack.rules import clone_volume_id
from pandastack.server.accounts.quotas import Quotas
from pandastack.server.settings import Settings
from pandastack.server.store import Sandbox, Store, Volume, open_store
from pandastack.server.store.volumes import PlannedAttach, VolumeConflict, attaching
from pandastack.server.volumes.service import VolumeService, clone_name
from pandastack.server.web.errors import ApiError

TEAM = "t1"


def new_row(sid: str, state: str = "starting", team: str = TEAM) -> Sandbox:
    now = time.time()
    return Sandbox(id=sid, team=team, template="base", state=state, created_at=now,
                   expires_at=now + 60, ttl_seconds=60, persistent=False, vcpus=1,
                   memory_mb=512, disk_mb=None, env={}, meta={}, last_activity_at=now,
                   ended_at=None, end_reason=None)


def new_volume(store: Store, name: str, vid: str, team: str = TEAM,
               host_id: str | None = None) -> Volume:
    return store.add_volume(Volume(id=vid, team=team, name=name, size_mb=64, host_id=host_id,
                                   source_volume=None, created_at=time.time(),
                                   deleted_at=None))


def admit(store: Store, sid: str, vid: str, read_only: bool, path: str = "/data") -> None:
    store.admit([new_row(sid)], attaching(None, [(sid, [PlannedAttach(vid, path, read_only)])]))


def attached(store: Store, vid: str) -> list[tuple[str, bool]]:
    return [(a.sandbox_id, a.read_only) for a in store.volume_attachments([vid])[vid]]


def test_one_writer_or_many_readers(store: Store) -> None:
    new_volume(store, "data", "vol-000000000001")
    admit(store, "sbx-000000000001", "vol-000000000001", False)
    for sid, ro in (("sbx-000000000002", False), ("sbx-000000000003", True)):
        with pytest.raises(VolumeConflict):
            admit(store, sid, "vol-000000000001", ro)
        assert store.get_sandbox(TEAM, sid) is None  # the refused create left no row
    assert attached(store, "vol-000000000001") == [("sbx-000000000001", False)]

    # Hibernation keeps the attachment; the end drops it in the same transaction.
    store.update_sandbox("sbx-000000000001", state="running")
    store.set_live_state("sbx-000000000001", "hibernated")
    with pytest.raises(VolumeConflict):
        admit(store, "sbx-000000000004", "vol-000000000001", True)
    store.end_sandbox("sbx-000000000001", "killed", "test")
    assert attached(store, "vol-000000000001") == []

    # Readers share; a writer waits for every reader to go.
    admit(store, "sbx-000000000005", "vol-000000000001", True)
    admit(store, "sbx-000000000006", "vol-000000000001", True)
    with pytest.raises(VolumeConflict):
        admit(store, "sbx-000000000007", "vol-000000000001", False)
    for sid in ("sbx-000000000005", "sbx-000000000006"):
        store.update_sandbox(sid, state="running", host_id="host-a")
    assert sorted(store.mark_host_lost(["host-a"])) == ["sbx-000000000005", "sbx-000000000006"]
    # Lost with their host, they keep the volume (it is on that host) until they are killed.
    assert attached(store, "vol-000000000001") == [("sbx-000000000005", True),
                                                   ("sbx-000000000006", True)]
    with pytest.raises(VolumeConflict):
        admit(store, "sbx-000000000007", "vol-000000000001", False)
    for sid in ("sbx-000000000005", "sbx-000000000006"):
        store.end_sandbox(sid, "killed", "test")
    admit(store, "sbx-000000000007", "vol-000000000001", False)
    assert attached(store, "vol-000000000001") == [("sbx-000000000007", False)]


def test_names_unique_among_live_volumes_per_team(store: Store) -> None:
    new_volume(store, "data", "vol-000000000011")
    new_volume(store, "data", "vol-000000000012", team="t2")  # another team's
    with pytest.raises(IntegrityError):
        new_volume(store, "data", "vol-000000000013")
    store.mark_volume_deleted("vol-000000000011")
    assert store.get_volume(TEAM, "data") is None
    new_volume(store, "data", "vol-000000000014")  # a deleted one's name is free
    got = store.get_volume(TEAM, "data")
    assert got is not None and got.id == "vol-000000000014"
    assert [v.id for v in store.list_volumes("t2")] == ["vol-000000000012"]


def test_two_racing_creates_get_one_writer(db: str) -> None:
    stores = [open_store(db), open_store(db)]  # two API servers on one database
    try:
        new_volume(stores[0], "data", "vol-000000000021")
        start = threading.Barrier(2)
        passed: list[str] = []
        refused: list[BaseException] = []
        failed: list[BaseException] = []

        def slow(s: Any, team: str) -> None:
            time.sleep(0.5)  # the other create runs meanwhile, unless it waits for the lock

        def create(i: int) -> None:
            sid = f"sbx-00000000020{i}"
            plan = [PlannedAttach("vol-000000000021", "/data", False)]
            start.wait()
            try:
                stores[i].admit([new_row(sid)], attaching(slow, [(sid, plan)]))
                passed.append(sid)
            except VolumeConflict as exc:
                refused.append(exc)
            except BaseException as exc:
                failed.append(exc)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failed, failed
        assert len(passed) == 1 and len(refused) == 1, (passed, refused)
        assert attached(stores[1], "vol-000000000021") == [(passed[0], False)]
        assert [r.id for r in stores[1].list_sandboxes(TEAM)] == passed  # nothing half-made
    finally:
        for s in stores:
            s.close()


def test_fork_children_get_copies_and_share_readers(store: Store) -> None:
    service = VolumeService(store, None, Quotas(store, Settings()))  # type: ignore[arg-type]
    new_volume(store, "data", "vol-000000000031", host_id="host-a")
    new_volume(store, "ref", "vol-000000000032", host_id="host-a")
    parent = new_row("sbx-000000000031")
    store.admit([parent], attaching(None, [(parent.id, [
        PlannedAttach("vol-000000000031", "/data", False),
        PlannedAttach("vol-000000000032", "/ref", True)])]))
    children = ["sbx-0000000000c1", "sbx-0000000000c2"]
    plans = service.plan_fork(parent, children)
    service.admit([new_row(c, "running") for c in children], None, plans)
    for child in children:
        copy_id = clone_volume_id("vol-000000000031", child)
        got = service.attached([child])[child]
        assert [(v.id, v.name, v.mount_path, v.read_only) for v in got] == [
            (copy_id, f"data-{child[4:]}", "/data", False),
            ("vol-000000000032", "ref", "/ref", True)]
        copy = store.volumes_by_id(TEAM, [copy_id])[copy_id]
        assert (copy.source_volume, copy.size_mb, copy.host_id) == (
            "vol-000000000031", 64, "host-a")
    assert attached(store, "vol-000000000031") == [(parent.id, False)]  # one writer each
    assert sorted(attached(store, "vol-000000000032")) == sorted(
        [(parent.id, True)] + [(c, True) for c in children])
    assert service.host_of_attached(parent.id) == "host-a"
    # A snapshot records the attachments; a restore gets copies of the writers, as a fork.
    assert [(e["id"], e["name"], e["mount_path"], e["read_only"])
            for e in service.record(parent.id)] == [
        ("vol-000000000031", "data", "/data", False), ("vol-000000000032", "ref", "/ref", True)]
    # Names stay within the pattern's 63 characters however deep the forks go.
    long = clone_name("x" * 63, "sbx-0123456789ab")
    assert len(long) == 63 and long.endswith("-0123456789ab")


def test_clones_count_against_the_volume_quota(store: Store) -> None:
    store.set_quota(TEAM, {"max_volume_gb": 0.1})  # 102 MiB: the source (64) fits, a copy not
    service = VolumeService(store, None, Quotas(store, Settings()))  # type: ignore[arg-type]
    new_volume(store, "data", "vol-000000000041")
    parent = new_row("sbx-000000000041")
    admit(store, parent.id, "vol-000000000041", False)
    plans = service.plan_fork(parent, ["sbx-0000000000d1"])
    with pytest.raises(ApiError) as exc:
        service.admit([new_row("sbx-0000000000d1", "running")], None, plans)
    assert (exc.value.status, exc.value.code) == (429, "quota_exceeded")
    assert store.get_sandbox(TEAM, "sbx-0000000000d1") is None
    assert [v.id for v in store.list_volumes(TEAM)] == ["vol-000000000041"]
