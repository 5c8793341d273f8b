"""What a request's path asks of the store: a verified-key cache and coalesced activity
touches (issue 36, target 1), each still exact where it must be: a revocation made by this
process counts at once, one made by another within `KEY_CACHE_SECONDS`, and an activity time
written is never older than `TOUCH_COALESCE_SECONDS`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, inspect

from pandastack.server.accounts.auth import create_key, hash_key
from pandastack.server.sandboxes.activity import TOUCH_COALESCE_SECONDS, ActivityTouches
from pandastack.server.store import Sandbox, Store, open_store
from pandastack.server.store import repo as repo_module

from .test_store_events import TEAM, events, new_row


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    seen: list[str] = []

    def note(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", note)


def test_a_key_is_read_once_then_served_from_the_cache(store: Store) -> None:
    _row, secret = create_key(store, "k", "team-a")
    digest = hash_key(secret)
    with statements(store) as seen:
        first = store.key_by_hash(digest)
        second = store.key_by_hash(digest)
    assert first is not None and second is not None and second.id == first.id
    assert len(seen) == 1


def test_a_revocation_here_counts_at_once(store: Store) -> None:
    row, secret = create_key(store, "k", "team-a")
    assert store.key_by_hash(hash_key(secret)) is not None  # now cached
    store.revoke_key(row.id)
    key = store.key_by_hash(hash_key(secret))
    assert key is not None and key.revoked_at is not None


def test_a_revocation_elsewhere_counts_once_the_cache_bound_passes(
        db: str, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    row, secret = create_key(store, "k", "team-a")
    assert store.key_by_hash(hash_key(secret)) is not None  # now cached
    other_server = open_store(db)
    try:
        other_server.revoke_key(row.id)
    finally:
        other_server.close()
    # the cache entry's age passes the bound (set to 0 rather than waited for)
    monkeypatch.setattr(repo_module, "KEY_CACHE_SECONDS", 0.0)
    key = store.key_by_hash(hash_key(secret))
    assert key is not None and key.revoked_at is not None


def test_an_unknown_key_is_not_remembered(store: Store) -> None:
    assert store.key_by_hash(hash_key("psk_unknown")) is None
    assert store._keys_by_hash == {}


def test_touches_within_the_window_write_once(store: Store) -> None:
    row = store.add_sandbox(new_row("sbx-touch"))
    touches = ActivityTouches(store)
    start = row.last_activity_at + 10
    with statements(store) as seen:
        touches.touch(row.id, start)
        touches.touch(row.id, start + TOUCH_COALESCE_SECONDS / 2)
    assert len([s for s in seen if s.startswith("UPDATE")]) == 1
    assert store.get_sandbox(row.team, row.id).last_activity_at == start  # type: ignore[union-attr]

    touches.touch(row.id, start + TOUCH_COALESCE_SECONDS)
    assert (store.get_sandbox(row.team, row.id).last_activity_at  # type: ignore[union-attr]
            == start + TOUCH_COALESCE_SECONDS)


def test_a_forgotten_sandbox_is_written_again(store: Store) -> None:
    row = store.add_sandbox(new_row("sbx-forget"))
    touches = ActivityTouches(store)
    now = row.last_activity_at + 10
    touches.touch(row.id, now)
    touches.forget(row.id)
    touches.touch(row.id, now + 0.01)
    assert store.get_sandbox(row.team, row.id).last_activity_at == now + 0.01  # type: ignore[union-attr]


def test_a_started_row_is_running_and_metered_in_one_transaction(store: Store) -> None:
    row = store.add_sandbox(new_row("sbx-start"))
    at = row.created_at + 1
    with statements(store) as seen:
        started = store.start_sandbox(row.id, created_at=at, last_activity_at=at,
                                      host_id="host-1")
    assert started is not None and started.state == "running" and started.host_id == "host-1"
    # the UPDATE is the check and the read (RETURNING): the create made a lookup, then the
    # update's own read, then the UPDATE
    assert [s for s in seen if "FROM sandboxes" in s or s.startswith("UPDATE sandboxes")] \
        == [s for s in seen if s.startswith("UPDATE sandboxes")]
    assert len([s for s in seen if s.startswith("UPDATE sandboxes")]) == 1
    [told] = events(store, row.team, types=["sandbox.created"])
    assert told["sandbox_id"] == row.id and told["actor"] == "system"
    assert {key: told[key] for key in ("state", "previous_state", "name", "vcpus",
                                       "memory_mb", "snapshot", "metadata", "template")} == {
        "state": "running", "previous_state": "starting", "name": None, "vcpus": 1,
        "memory_mb": 512, "snapshot": None, "metadata": {}, "template": "base"}
    kinds = {s.kind for s in store.usage_segments(row.team, 0, at + 60)
             if s.subject_id == row.id}
    assert kinds == {"compute", "disk"}
    assert store.get_sandbox(row.team, row.id).created_at == at  # type: ignore[union-attr]


def test_a_row_killed_while_starting_is_not_started(store: Store) -> None:
    row = store.add_sandbox(new_row("sbx-killed"))
    store.end_sandbox(row.id, "killed", "killed by API request")
    assert store.start_sandbox(row.id, last_activity_at=row.created_at + 1) is None
    after = store.get_sandbox(row.team, row.id)
    assert after is not None and after.state == "killed"
    assert [s for s in store.usage_segments(row.team, 0, row.created_at + 60)
            if s.subject_id == row.id] == []
    assert store.start_sandbox("sbx-000000000000") is None


def test_a_row_written_by_its_create_is_not_touched_again_at_once(store: Store) -> None:
    row = store.add_sandbox(new_row("sbx-fresh"))
    touches = ActivityTouches(store)
    touches.written(row.id, row.last_activity_at)
    with statements(store) as seen:
        touches.touch(row.id, row.last_activity_at + TOUCH_COALESCE_SECONDS / 2)
    assert seen == []
    touches.touch(row.id, row.last_activity_at + TOUCH_COALESCE_SECONDS)
    assert (store.get_sandbox(row.team, row.id).last_activity_at  # type: ignore[union-attr]
            == row.last_activity_at + TOUCH_COALESCE_SECONDS)


def test_the_row_read_per_request_has_every_column_of_the_orm_read(store: Store) -> None:
    row = new_row("sbx-columns", state="running")
    row.env, row.meta, row.persistent, row.name = {"A": "1"}, {"k": "v"}, True, "named"
    store.add_sandbox(row)
    with statements(store) as seen:
        got = store.get_sandbox(row.team, row.id)
    assert len(seen) == 1
    with store.session() as s:
        orm = s.get(Sandbox, row.id)
        assert orm is not None
        want = {attr.key: getattr(orm, attr.key) for attr in inspect(Sandbox).column_attrs}
    assert got is not None
    assert {key: getattr(got, key) for key in want} == want
    assert got.env == {"A": "1"} and got.meta == {"k": "v"} and got.persistent is True
    assert store.get_sandbox("another-team", row.id) is None
    assert store.sandbox_by_id(row.id) is not None
    assert store.sandbox_by_id("sbx-000000000000") is None


def _ended_record(store: Store, sid: str) -> tuple[object, ...]:
    """What an end leaves: the row's end, its event and its segments."""
    row = store.sandbox_by_id(sid)
    assert row is not None
    [told] = [e for e in events(store, row.team, types=["sandbox.killed"])
              if e["sandbox_id"] == sid]
    data = {k: v for k, v in told.items() if k not in ("seq", "time", "sandbox_id", "id")}
    open_segments = [s for s in store.usage_segments(row.team, 0, row.ended_at or 0)
                     if s.subject_id == sid and s.ended_at is None]
    return row.state, row.end_reason, data, open_segments


def test_an_end_from_the_state_read_writes_what_the_read_path_writes(store: Store) -> None:
    for sid in ("sbx-endread", "sbx-endknown"):
        store.add_sandbox(new_row(sid))
        store.start_sandbox(sid, last_activity_at=time.time())
    store.end_sandbox("sbx-endread", "killed", "killed by API request")
    with statements(store) as seen:
        ended = store.end_sandbox("sbx-endknown", "killed", "killed by API request",
                                  current="running")
    assert ended is not None and ended.state == "killed" and ended.ended_at is not None
    # no read of the row before the UPDATE that checks its state
    assert not [s for s in seen if "FROM sandboxes" in s], seen
    assert _ended_record(store, "sbx-endknown") == _ended_record(store, "sbx-endread")
    assert store.sandbox_attachments(["sbx-endknown"]).get("sbx-endknown", []) == []


def test_an_end_from_a_stale_state_reads_the_row_and_ends_it_once(store: Store) -> None:
    store.add_sandbox(new_row("sbx-stale"))
    store.start_sandbox("sbx-stale", last_activity_at=time.time())
    store.set_live_state("sbx-stale", "paused")  # moved on since the caller read it
    ended = store.end_sandbox("sbx-stale", "killed", "killed by API request",
                              current="running")
    assert ended is not None and ended.state == "killed"
    [told] = events(store, TEAM, types=["sandbox.killed"])
    assert told["previous_state"] == "paused"
    again = store.end_sandbox("sbx-stale", "expired", "late", current="running")
    assert again is not None and again.state == "killed"  # an ended row is left as it is
    assert len(events(store, TEAM, types=["sandbox.killed", "sandbox.expired"])) == 1
