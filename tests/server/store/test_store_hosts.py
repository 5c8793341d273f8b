"""The host registry and leases on real SQLite and a real PostgreSQL (the `db` fixture): hosts
keep their id across registrations, a stale one comes back under a new epoch, heartbeats renew
a host and all its leases in one statement each, fencing moves a host and its leases to a new
epoch once, and every time is the database's. A host is made stale by moving its heartbeat
back in the database, not by waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text

from pandastack.server.store import Store, open_store
from tests.services import Postgres

CAPACITY: dict[str, Any] = {"vcpus": 8, "memory_mb": 16384, "disk_mb": 100_000}


@pytest.fixture
def store(db: str) -> Iterator[Store]:
    s = open_store(db)
    yield s
    s.close()


def age(store: Store, host_id: str, seconds: float) -> None:
    """Move the host's last heartbeat `seconds` into the past."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE hosts SET last_heartbeat_at = last_heartbeat_at - :s "
                          "WHERE id = :id"), {"s": seconds, "id": host_id})


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def test_a_host_keeps_its_id_and_epoch_while_it_is_live(store: Store) -> None:
    a = store.register_host("http://10.0.0.1:7000", **CAPACITY, labels={"zone": "a"},
                            version="0.1.0")
    assert a.id.startswith("host-") and a.epoch == 1 and not a.draining
    again = store.register_host("http://10.0.0.1:7000", vcpus=4, memory_mb=8192,
                                disk_mb=50_000, labels={"zone": "b"}, version="0.2.0")
    assert (again.id, again.epoch) == (a.id, 1)
    assert (again.vcpus, again.memory_mb, again.disk_mb, again.labels, again.version) == (
        4, 8192, 50_000, {"zone": "b"}, "0.2.0")
    b = store.register_host("http://10.0.0.2:7000", **CAPACITY)
    assert b.id != a.id and b.labels == {} and b.epoch == 1
    assert [h.id for h in store.list_hosts()] == [a.id, b.id]

    assert store.set_draining(a.id, True) is not None
    assert store.register_host("http://10.0.0.1:7000", **CAPACITY).draining  # an operator's
    got = store.get_host(a.id)
    assert got is not None and got.draining and got.vcpus == CAPACITY["vcpus"]
    assert store.get_host("host-nope") is None


def test_a_stale_host_registers_under_a_new_epoch_and_its_old_leases_lapse(
        store: Store) -> None:
    host = store.register_host("http://h:1", **CAPACITY)
    assert store.lease("sbx-old", host.id, host.epoch)
    age(store, host.id, 60)
    back = store.register_host("http://h:1", **CAPACITY, stale_after_seconds=30)
    assert (back.id, back.epoch) == (host.id, 2)
    assert store.heartbeat(host.id, 1) is None  # the old epoch is refused
    assert store.heartbeat(host.id, 2) == 0  # and its lease is not renewed by the new one
    assert [(lease.sandbox_id, lease.epoch) for lease in store.host_leases(host.id)] == [
        ("sbx-old", 1)]
    # Stale by less than the window: not a new epoch.
    age(store, host.id, 10)
    assert store.register_host("http://h:1", **CAPACITY, stale_after_seconds=30).epoch == 2


def test_a_heartbeat_renews_the_host_and_all_its_leases_in_one_statement_each(
        store: Store) -> None:
    host = store.register_host("http://h:1", **CAPACITY)
    other = store.register_host("http://h:2", **CAPACITY)
    for i in range(50):
        assert store.lease(f"sbx-{i:03}", host.id, host.epoch)
    assert store.lease("sbx-other", other.id, other.epoch)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE hosts SET last_heartbeat_at = 0"))
        conn.execute(text("UPDATE leases SET renewed_at = 0"))
    before = store.db_time()

    with statements(store) as sql:
        assert store.heartbeat(host.id, host.epoch) == 50
    writes = [s for s in sql if s.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    assert len(writes) == 2, sql
    assert writes[0].lstrip().upper().startswith("UPDATE HOSTS")
    assert writes[1].lstrip().upper().startswith("UPDATE LEASES")

    leases = {lease.sandbox_id: lease for lease in store.host_leases(host.id)}
    assert len(leases) == 50 and all(lease.renewed_at >= before - 1 for lease in leases.values())
    renewed = store.get_host(host.id)
    assert renewed is not None and renewed.last_heartbeat_at >= before - 1
    untouched = store.lease_of("sbx-other")
    assert untouched is not None and untouched.renewed_at == 0
    assert store.heartbeat("host-nope", 1) is None


def test_times_are_the_databases_not_the_callers(store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller whose clock is a day off changes no time the registry writes or compares."""
    skew = 86400.0
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - skew)
    start = store.db_time()
    assert abs(start - real()) < skew / 2  # the database's clock is not the patched one
    host = store.register_host("http://h:1", **CAPACITY)
    assert store.lease("sbx-1", host.id, host.epoch)
    assert store.heartbeat(host.id, host.epoch) == 1
    end = store.db_time()
    got, lease = store.get_host(host.id), store.lease_of("sbx-1")
    assert got is not None and lease is not None
    for value in (got.created_at, got.last_heartbeat_at, lease.renewed_at):
        assert start - 1 <= value <= end + 1, (start, value, end)
    assert store.stale_hosts(older_than_seconds=60) == []
    age(store, host.id, 120)
    assert [h.id for h in store.stale_hosts(older_than_seconds=60)] == [host.id]


def test_a_fence_moves_a_stale_host_and_its_leases_to_a_new_epoch_once(store: Store) -> None:
    lost = store.register_host("http://h:1", **CAPACITY)
    live = store.register_host("http://h:2", **CAPACITY)
    for sid in ("sbx-a", "sbx-b"):
        assert store.lease(sid, lost.id, lost.epoch)
    assert store.lease("sbx-c", live.id, live.epoch)
    age(store, lost.id, 100)
    assert [h.id for h in store.stale_hosts(older_than_seconds=30)] == [lost.id]

    # Two API servers saw it stale at epoch 1: only the first fences it.
    assert store.fence(lost.id, epoch=1, older_than_seconds=30) == 2
    assert store.fence(lost.id, epoch=1, older_than_seconds=30) is None
    assert {(lease.sandbox_id, lease.epoch) for lease in store.host_leases(lost.id)} == {
        ("sbx-a", 2), ("sbx-b", 2)}
    # The agent still at epoch 1 can neither heartbeat nor take a lease.
    assert store.heartbeat(lost.id, 1) is None
    assert not store.lease("sbx-d", lost.id, 1)
    assert store.lease_of("sbx-d") is None
    # A live host is not fenced by a reaper's conditional fence; unconditionally it is.
    assert store.fence(live.id, older_than_seconds=30) is None
    assert store.fence(live.id) == 2
    c = store.lease_of("sbx-c")
    assert c is not None and c.epoch == 2
    assert store.fence("host-nope") is None


def test_a_lease_moves_between_hosts_and_only_its_holder_releases_it(store: Store) -> None:
    a = store.register_host("http://h:1", **CAPACITY)
    b = store.register_host("http://h:2", **CAPACITY)
    assert store.lease("sbx-1", a.id, a.epoch)
    first = store.lease_of("sbx-1")
    assert first is not None and (first.host_id, first.epoch) == (a.id, 1)
    assert store.lease("sbx-1", b.id, b.epoch)  # e.g. after a migration to b
    moved = store.lease_of("sbx-1")
    assert moved is not None and moved.host_id == b.id
    assert not store.release("sbx-1", host_id=a.id)  # a's late release leaves b's lease
    assert store.lease_of("sbx-1") is not None
    assert store.release("sbx-1", host_id=b.id)
    assert store.lease_of("sbx-1") is None
    assert not store.release("sbx-1")
    assert not store.lease("sbx-2", "host-nope", 1)


def test_a_sandbox_row_has_a_host_id_for_placement(store: Store) -> None:
    from pandastack.server.store import Sandbox

    host = store.register_host("http://h:1", **CAPACITY)
    row = Sandbox(id="sbx-1", team="t", template="base", state="running", created_at=1.0,
                  ttl_seconds=60, persistent=False, vcpus=1, memory_mb=256, env={}, meta={},
                  last_activity_at=1.0, host_id=host.id)
    store.add_sandbox(row)
    got = store.get_sandbox("t", "sbx-1")
    assert got is not None and got.host_id == host.id
    assert store.update_sandbox("sbx-1", host_id=None) is not None
    again = store.get_sandbox("t", "sbx-1")
    assert again is not None and again.host_id is None


def test_a_fence_waits_for_a_lease_being_taken_and_moves_it_too(postgres: Postgres) -> None:
    """The race the share lock closes: a lease checked its host's epoch, a fence commits
    before the lease does. The lease must end up under the fenced epoch, not the old one."""
    with postgres.database() as dsn:
        store = open_store(dsn)
        try:
            host = store.register_host("http://h:1", **CAPACITY)
            checked, go = threading.Event(), threading.Event()

            def pause_after_the_check(_conn: object, _cursor: object, statement: str,
                                      *_: object) -> None:
                # The first statement of lease(): the check of the host's epoch.
                if threading.current_thread().name == "leasing" and not checked.is_set():
                    checked.set()
                    go.wait(10)

            event.listen(store.engine, "after_cursor_execute", pause_after_the_check)
            taken: list[bool] = []
            leasing = threading.Thread(
                target=lambda: taken.append(store.lease("sbx-1", host.id, host.epoch)),
                name="leasing")
            leasing.start()
            assert checked.wait(10)
            fenced: list[int | None] = []
            fencing = threading.Thread(target=lambda: fenced.append(store.fence(host.id)))
            fencing.start()
            fencing.join(0.5)  # given time to commit first, were it not made to wait
            go.set()
            leasing.join(10)
            fencing.join(10)
            event.remove(store.engine, "after_cursor_execute", pause_after_the_check)
            assert taken == [True] and fenced == [2]
            lease = store.lease_of("sbx-1")
            assert lease is not None and lease.epoch == 2
        finally:
            store.close()
