"""The standalone `Registry` on real SQLite and PostgreSQL (the `db` fixture): what an agent
reports at a heartbeat lands in the host's one UPDATE, a fence of a live host still makes its
next registration a new epoch, and migration 0007 goes down and up again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, inspect, text

from pandastack.registry import Registry, Usage
from pandastack.server.store.db import make_engine
from tests.registry.conftest import registry_of
from tests.server.store.test_store_migrations import migrate_to

CAPACITY: dict[str, Any] = {"vcpus": 8, "memory_mb": 16384, "disk_mb": 100_000}
USAGE_COLUMNS = {"templates", "sandboxes", "used_vcpus", "used_memory_mb", "fenced"}


@pytest.fixture
def registry(db: str) -> Iterator[Registry]:
    with registry_of(db) as r:
        yield r


def test_usage_is_written_in_the_heartbeats_update_of_the_host(registry: Registry) -> None:
    host = registry.register_host("unix:/run/a.sock", **CAPACITY)
    assert (host.templates, host.sandboxes, host.used_vcpus, host.used_memory_mb) == (
        [], 0, 0, 0)
    assert registry.lease("sbx-1", host.id, host.epoch)
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        seen.append(statement)

    event.listen(registry.engine, "before_cursor_execute", record)
    try:
        usage = Usage(templates=("python", "base", "base"), sandboxes=3, used_vcpus=2,
                      used_memory_mb=1024)
        assert registry.heartbeat(host.id, host.epoch, usage=usage) == 1
    finally:
        event.remove(registry.engine, "before_cursor_execute", record)
    writes = [s for s in seen if s.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    assert len(writes) == 2 and writes[0].lstrip().upper().startswith("UPDATE HOSTS"), seen
    assert "used_memory_mb" in writes[0] and "templates" in writes[0]
    got = registry.get_host(host.id)
    assert got is not None
    assert (got.templates, got.sandboxes, got.used_vcpus, got.used_memory_mb) == (
        ["base", "python"], 3, 2, 1024)
    # A heartbeat without usage keeps the last report; a refused one writes nothing.
    assert registry.heartbeat(host.id, host.epoch) == 1
    assert registry.heartbeat(host.id, host.epoch + 1, usage=Usage()) is None
    again = registry.get_host(host.id)
    assert again is not None and again.sandboxes == 3


def test_a_fence_of_a_live_host_makes_its_next_registration_a_new_epoch(
        registry: Registry) -> None:
    host = registry.register_host("unix:/run/a.sock", **CAPACITY)
    assert registry.lease("sbx-1", host.id, host.epoch)
    assert registry.fence(host.id) == 2  # an operator's: the heartbeat is fresh
    fenced = registry.get_host(host.id)
    assert fenced is not None and fenced.fenced
    back = registry.register_host("unix:/run/a.sock", **CAPACITY)
    assert (back.id, back.epoch, back.fenced) == (host.id, 3, False)
    # The fenced lease is under 2: not this agent's (it kills that VM).
    assert [(lease.sandbox_id, lease.epoch) for lease in registry.host_leases(host.id)] == [
        ("sbx-1", 2)]
    # And a live host that was not fenced keeps its epoch.
    assert registry.register_host("unix:/run/a.sock", **CAPACITY).epoch == 3


def test_migration_0007_goes_down_and_up_again(db: str) -> None:
    with registry_of(db) as registry:
        host = registry.register_host("unix:/run/a.sock", **CAPACITY)
        registry.heartbeat(host.id, host.epoch, usage=Usage(sandboxes=2))

    def columns() -> set[str]:
        engine = make_engine(db)
        try:
            return {c["name"] for c in inspect(engine).get_columns("hosts")}
        finally:
            engine.dispose()

    assert columns() >= USAGE_COLUMNS
    migrate_to(db, "0006", down=True)
    assert not USAGE_COLUMNS & columns()
    engine = make_engine(db)
    with engine.begin() as conn:  # the host is kept; the new columns come back with defaults
        assert conn.execute(text("SELECT id FROM hosts")).scalars().all() == [host.id]
    engine.dispose()
    with registry_of(db) as registry:
        got = registry.get_host(host.id)
        assert got is not None and (got.sandboxes, got.templates, got.fenced) == (0, [], False)
