"""The event log and the webhook delivery queue in the store, on real SQLite and a real
PostgreSQL (the `db` fixture): state changes write their events in their own transaction (a
rolled-back one leaves none), with the request's actor or "system"; reads are per team,
filtered and resumable; pruning keeps its mark; the fan-out and the queue survive a
restart (a second Store on the same database). Team sequences: test_store_event_sequences."""

from __future__ import annotations

import json
import time

import pytest

from pandastack.server.events.log import StreamSlots, stream
from pandastack.server.store import Sandbox, Snapshot, Store, TemplateVersion, open_store
from pandastack.server.store.events import Caller, Webhook, caller, forking, note_caller
from pandastack.server.store.events_log import Claimed, EventLog
from pandastack.server.store.webhook_queue import claim_due_by_team
from pandastack.server.web.errors import ApiError

TEAM = "t1"


def new_row(sid: str, state: str = "starting", team: str = TEAM) -> Sandbox:
    now = time.time()
    return Sandbox(id=sid, team=team, template="base", state=state, created_at=now,
                   expires_at=now + 60, ttl_seconds=60, persistent=False, vcpus=1,
                   memory_mb=512, disk_mb=None, env={}, meta={}, last_activity_at=now,
                   ended_at=None, end_reason=None)


def claim(store: Store, now: float) -> list[Claimed]:
    return [c for _, c in claim_due_by_team(store, now, room=10, per_team=10, running={},
                                            lease_seconds=60)]


def events(store: Store, team: str = TEAM, after: int = 0,
           types: list[str] | None = None) -> list[dict[str, object]]:
    got, _ = EventLog(store, settle_seconds=0).after(team, after, types)
    return got


def test_state_changes_write_events_in_their_transaction(store: Store) -> None:
    sid, child = "sbx-000000000001", "sbx-000000000002"
    token = caller.set(Caller())
    try:
        note_caller("key_abc", TEAM)
        store.admit([new_row(sid)])
        store.update_sandbox(sid, state="running")
    finally:
        caller.reset(token)
    store.set_live_state(sid, "paused")
    store.set_live_state(sid, "running")
    store.set_live_state(sid, "hibernated")
    store.set_live_state(sid, "running")
    with forking(sid):
        store.admit([new_row(child, "running")])
    store.add_snapshot(Snapshot(id="snap-000000000001", team=TEAM, name="s",
                                source_sandbox=sid, template="base", created_at=time.time(),
                                vcpus=1, memory_mb=512, disk_mb=None, size_bytes=10,
                                volumes=[]))
    store.end_sandbox(sid, "expired", "ttl elapsed")
    store.end_sandbox(sid, "killed", "again: already ended, no event")
    got = events(store)
    assert [e["type"] for e in got] == [
        "sandbox.created", "sandbox.paused", "sandbox.resumed", "sandbox.hibernated",
        "sandbox.woken", "sandbox.forked", "sandbox.snapshotted", "sandbox.expired"]
    ids = [int(e["id"]) for e in got]  # type: ignore[call-overload]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert got[0]["actor"] == "key_abc" and got[1]["actor"] == "system"
    assert got[5]["parent"] == sid and got[5]["children"] == [child]
    assert got[6]["snapshot_id"] == "snap-000000000001" and got[6]["sandbox_id"] == sid
    assert got[7]["reason"] == "ttl elapsed" and got[7]["previous_state"] == "running"
    assert all(e["team"] == TEAM for e in got)

    # A transaction that rolls back takes its event with it.
    with pytest.raises(RuntimeError), store.session() as s:
        row = s.get(Sandbox, child)
        assert row is not None
        row.state = "paused"
        s.flush()
        raise RuntimeError("rolled back")
    assert [e["type"] for e in events(store, after=ids[-1])] == []

    # Filters, resume and another team.
    assert [e["type"] for e in events(store, types=["sandbox.p*", "sandbox.paused"])] == [
        "sandbox.paused"]
    assert [e["type"] for e in events(store, types=["sandbox.*"], after=ids[5])] == [
        "sandbox.snapshotted", "sandbox.expired"]
    assert events(store, team="other") == []


def test_template_builds_and_failures(store: Store) -> None:
    row = TemplateVersion(id="bld-000000000001", team=TEAM, name="app", version=0,
                          status="building", env={}, created_at=time.time())
    store.add_template_version(row, {"steps": []})
    store.finish_template_build(row.id, "log", {"status": "failed", "error": "step 2",
                                                "finished_at": time.time()})
    store.admit([new_row("sbx-000000000003")])
    store.end_sandbox("sbx-000000000003", "failed", "create failed: boom")
    got = events(store)
    assert [e["type"] for e in got] == ["template.build.started", "template.build.failed",
                                        "sandbox.failed"]
    assert got[0]["template"] == "app:1" and got[1]["error"] == "step 2"
    assert got[2]["previous_state"] == "starting"


def test_prune_and_its_mark(store: Store) -> None:
    log = EventLog(store, settle_seconds=0)
    first = log.record(TEAM, "quota.exceeded", limit="max_sandboxes")
    second = log.record(TEAM, "quota.exceeded", limit="max_vcpus")
    assert log.pruned_through(TEAM) == 0 and log.head(TEAM) == second
    newest_id = log.head()
    assert log.prune(time.time() + 1) == 2
    assert log.pruned_through(TEAM) == second and log.oldest(TEAM) is None
    assert log.pruned_through() == newest_id  # the global mark, for admin readers
    third = log.record(TEAM, "quota.exceeded", limit="max_memory_mb")
    assert third > second > first  # numbers are never reused, even with the log emptied
    assert log.head() > newest_id  # nor are ids
    assert [e["id"] for e in log.after(TEAM, 0)[0]] == [third]


def test_settle_holds_back_the_newest_events_of_global_readers(store: Store) -> None:
    log = EventLog(store, settle_seconds=30)
    log.record(TEAM, "quota.exceeded", limit="max_sandboxes")
    got, cursor = log.after(TEAM, 0, global_ids=True)
    assert (got, cursor) == ([], 0)  # too young: an older id may still commit
    got, cursor = log.after(TEAM, 0, now=time.time() + 31, global_ids=True)
    assert len(got) == 1 and cursor == got[0]["id"]
    # A team's numbers commit in order (its sequence row's lock): no wait.
    got, cursor = log.after(TEAM, 0)
    assert [e["id"] for e in got] == [1] and cursor == 1


def test_fan_out_and_queue_survive_a_restart(db: str) -> None:
    store = open_store(db)
    log = EventLog(store, settle_seconds=0)
    now = time.time()
    hook = Webhook(id="wh_0000000000000001", team=TEAM, url="http://127.0.0.1:9/",
                   events=["sandbox.*"], description=None, secret="s" * 20,
                   created_at=now - 10)
    assert log.add_webhook(hook, 1)
    assert not log.add_webhook(Webhook(id="wh_0000000000000002", team=TEAM, url="http://x/",
                                       events=["*"], secret="s" * 20, created_at=now), 1)
    log.record(TEAM, "quota.exceeded", limit="max_sandboxes")  # not a type it takes
    log.record(TEAM, "sandbox.killed", sandbox_id="sbx-000000000009")
    log.record("other", "sandbox.killed", sandbox_id="sbx-00000000000a")
    assert log.fan_out(time.time()) == 1
    assert log.fan_out(time.time()) == 0  # the mark moved with the rows
    claimed = claim(store, time.time())
    assert [(c.webhook_id, c.event_type, c.attempts) for c in claimed] == [
        (hook.id, "sandbox.killed", 1)]
    assert claim(store, time.time()) == []  # claimed: not due again until the lease
    log.finish_attempt(claimed[0].id, now=time.time(), delivered=False, response_status=500,
                       error="answered HTTP 500", retry_at=time.time() + 30)
    store.close()

    store = open_store(db)  # a restarted server
    try:
        log = EventLog(store, settle_seconds=0)
        assert log.fan_out(time.time()) == 0
        assert claim(store, time.time()) == []
        again = claim(store, time.time() + 31)
        assert [c.attempts for c in again] == [2]
        log.finish_attempt(again[0].id, now=time.time(), delivered=True, response_status=204,
                           error=None, retry_at=None)
        [row] = log.deliveries(hook.id)
        assert (row.status, row.attempts, row.response_status, row.error) == (
            "delivered", 2, 204, None)
        assert log.delete_webhook(TEAM, hook.id) and log.deliveries(hook.id) == []
        assert not log.delete_webhook("other", hook.id)
    finally:
        store.close()


async def test_a_pruned_resume_point_is_told_then_the_oldest_kept_follows(store: Store) -> None:
    log = EventLog(store, settle_seconds=0)
    old = log.record(TEAM, "quota.exceeded", limit="max_sandboxes")
    log.prune(time.time() + 1)
    kept = log.record(TEAM, "quota.exceeded", limit="max_vcpus")
    frames = stream(log, TEAM, old - 1, None)
    try:
        notice = (await anext(frames)).decode()
        assert notice.startswith("event: events.truncated\n")
        assert json.loads(notice.split("data: ", 1)[1]) == {
            "after": old - 1, "oldest": kept, "pruned_through": old}
        assert json.loads((await anext(frames)).decode().split("data: ", 1)[1]) == {
            "after": old}
        first = (await anext(frames)).decode()
        assert first.startswith(f"id: {kept}\nevent: quota.exceeded\n")
    finally:
        await frames.aclose()  # type: ignore[attr-defined]
    # A resume point that was not pruned is no notice.
    frames = stream(log, TEAM, old, None)
    try:
        assert (await anext(frames)).decode().startswith("event: ready\n")
    finally:
        await frames.aclose()  # type: ignore[attr-defined]


def test_stream_slots_are_bounded_and_given_back() -> None:
    slots = StreamSlots(1)
    release = slots.take(TEAM)
    with pytest.raises(ApiError):
        slots.take(TEAM)
    other = slots.take("other")  # per team
    release()
    other()
    assert slots.open == {}
    slots.take(TEAM)()
