"""Each team's own event sequence (issue 33, ADR 0035's addendum), on real SQLite and a real
PostgreSQL (the `db` fixture): a team's ids do not move when another team makes events,
streams resume and pruning is told per team, admin readers see the global ids, concurrent
writers of one team never share a number (and on PostgreSQL commit in number order), and a
database made before the sequences migrates with its events numbered per team in id order."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import text

from pandastack.server.events.log import stream
from pandastack.server.store import Sandbox, Store, open_store
from pandastack.server.store.db import make_engine
from pandastack.server.store.events import new_event
from pandastack.server.store.events_log import EventLog
from tests.server.store.test_store_migrations import upgrade_to

A, B = "team-a", "team-b"


def sandbox(sid: str, team: str) -> Sandbox:
    now = time.time()
    return Sandbox(id=sid, team=team, template="base", state="running", created_at=now,
                   expires_at=now + 60, ttl_seconds=60, persistent=False, vcpus=1,
                   memory_mb=512, disk_mb=None, env={}, meta={}, last_activity_at=now,
                   ended_at=None, end_reason=None)


def data(frame: bytes) -> dict[str, object]:
    found: dict[str, object] = json.loads(frame.decode().split("data: ", 1)[1])
    return found


async def frames_of(log: EventLog, team: str, resume: int | None, count: int,
                    global_ids: bool = False) -> list[bytes]:
    frames = stream(log, team, resume, None, global_ids)
    try:
        return [await anext(frames) for _ in range(count)]
    finally:
        await frames.aclose()  # type: ignore[attr-defined]


async def test_a_teams_ids_do_not_move_when_another_team_makes_events(store: Store) -> None:
    log = EventLog(store, settle_seconds=0)
    log.record(A, "quota.exceeded", limit="max_sandboxes")
    store.admit([sandbox("sbx-00000000000b", B)])  # sandbox.created of B, in the hook
    store.end_sandbox("sbx-00000000000b", "killed", "by test")
    for _ in range(3):
        log.record(B, "quota.exceeded", limit="max_vcpus")
    log.record(A, "quota.exceeded", limit="max_memory_mb")

    mine, cursor = log.after(A, 0)
    assert [e["id"] for e in mine] == [1, 2] and cursor == 2
    assert all("seq" not in e for e in mine)  # nothing of the global sequence
    theirs, _ = log.after(B, 0)
    assert [(e["id"], e["type"]) for e in theirs] == [
        (1, "sandbox.created"), (2, "sandbox.killed"), (3, "quota.exceeded"),
        (4, "quota.exceeded"), (5, "quota.exceeded")]
    assert log.head(A) == 2 and log.head(B) == 5 and log.head() == 7

    # The stream: `ready` at the team's head, SSE ids the team's numbers.
    ready, = await frames_of(log, A, None, 1)
    assert data(ready) == {"after": 2}
    got = await frames_of(log, A, 0, 3)
    assert [f.decode().split("\n", 1)[0] for f in got[1:]] == ["id: 1", "id: 2"]

    # An admin's reader: the global ids, the team's number as `seq`.
    admin, _ = log.after(A, 0, global_ids=True)
    assert [(e["id"], e["seq"]) for e in admin] == [(1, 1), (7, 2)]
    got = await frames_of(log, A, 1, 2, global_ids=True)
    assert data(got[0]) == {"after": 1}
    assert got[1].decode().startswith("id: 7\n") and data(got[1])["seq"] == 2
    ready, = await frames_of(log, A, None, 1, global_ids=True)
    assert data(ready) == {"after": 7}


async def test_resume_and_pruning_are_per_team(store: Store) -> None:
    log = EventLog(store, settle_seconds=0)
    for n in range(3):
        log.record(A, "quota.exceeded", limit=f"a{n}")
        log.record(B, "quota.exceeded", limit=f"b{n}")

    # Last-Event-ID 1 of team A: A's 2 and 3 follow, whatever B's numbers are.
    got = await frames_of(log, A, 1, 3)
    assert data(got[0]) == {"after": 1}
    assert [(data(f)["id"], data(f)["limit"]) for f in got[1:]] == [(2, "a1"), (3, "a2")]
    # A resume point past the team's newest (say a global id kept from before the team
    # sequences) was never a number of this team: the stream starts at its newest.
    ready, = await frames_of(log, A, 6, 1)
    assert data(ready) == {"after": 3}

    # A's two oldest fall out of the window; B's are all kept.
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE events SET time = 1.0 WHERE team = :t AND seq <= 2"),
                     {"t": A})
    assert log.prune(2.0) == 2
    assert (log.pruned_through(A), log.oldest(A)) == (2, 3)
    assert (log.pruned_through(B), log.oldest(B)) == (0, 1)
    got = await frames_of(log, A, 0, 3)
    assert got[0].decode().startswith("event: events.truncated\n")
    assert data(got[0]) == {"after": 0, "oldest": 3, "pruned_through": 2}
    assert data(got[1]) == {"after": 2} and data(got[2])["id"] == 3
    got = await frames_of(log, B, 0, 2)
    assert data(got[0]) == {"after": 0} and data(got[1])["id"] == 1

    # A log emptied of a team's events still knows how far it went.
    assert log.prune(time.time() + 1) == 4
    assert (log.pruned_through(A), log.oldest(A), log.head(A)) == (3, None, 3)
    assert log.record(A, "quota.exceeded", limit="again") == 4


def test_concurrent_writers_of_one_team_never_share_a_number(store: Store) -> None:
    writers, each = 4, 10
    start = threading.Barrier(writers)
    failed: list[BaseException] = []

    def write(n: int) -> None:
        log = EventLog(store, settle_seconds=0)
        start.wait()
        try:
            for i in range(each):
                log.record(A, "quota.exceeded", limit=f"w{n}-{i}")
                if i == 0:  # and a state change's events, from the flush hook
                    store.admit([sandbox(f"sbx-{n:012x}", A)])
        except BaseException as e:  # reported below, from the test's thread
            failed.append(e)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed == []
    got, _ = EventLog(store, settle_seconds=0).after(A, 0, limit=1000)
    total = writers * (each + 1)
    assert [e["id"] for e in got] == list(range(1, total + 1))
    assert EventLog(store).head(A) == total


def test_a_teams_numbers_commit_in_order_on_postgresql(store: Store) -> None:
    """The second writer of a team waits for the first's transaction: a reader never sees
    number 2 while number 1 may still commit (so team readers need no settle delay)."""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time anyway")
    log = EventLog(store, settle_seconds=0)
    second: list[int] = []
    with store.session() as first:
        first.add(new_event(A, "quota.exceeded", limit="first"))
        first.flush()
        writer = threading.Thread(target=lambda: second.append(
            log.record(A, "quota.exceeded", limit="second")))
        writer.start()
        deadline = time.monotonic() + 60
        with store.engine.connect() as conn:
            while not conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")).scalar_one():
                assert time.monotonic() < deadline, "the second writer never waited"
                conn.rollback()
                time.sleep(0.05)
        assert log.after(A, 0) == ([], 0)  # neither is committed
    writer.join(60)
    assert second == [2]
    assert [e["limit"] for e in log.after(A, 0)[0]] == ["first", "second"]


def test_an_old_database_numbers_its_events_per_team_in_id_order(db: str) -> None:
    upgrade_to(db, "0014")
    engine = make_engine(db)
    event = ("INSERT INTO events (id, team, type, time, actor, data) VALUES "
             "(:id, :team, 'quota.exceeded', 1.0, 'system', '{}')")
    with engine.begin() as conn:
        conn.execute(text(event), [{"id": i, "team": t} for i, t in (
            (1, A), (2, A), (3, B), (4, A), (5, B), (6, "gone"), (7, B))])
        conn.execute(text("DELETE FROM events WHERE id IN (1, 6, 7)"))  # pruned
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT setval('events_id_seq', 7)"))
        conn.execute(text("INSERT INTO webhook_deliveries (webhook_id, team, event_id, "
                          "event_type, body, status, attempts, created_at) VALUES "
                          "('wh', :team, :event, 'quota.exceeded', :body, :status, 0, 1.0)"),
                     [{"team": A, "event": 4, "status": "pending",
                       "body": json.dumps({"id": 4, "type": "quota.exceeded"})},
                      {"team": A, "event": 2, "status": "delivered", "body": '{"id": 2}'},
                      {"team": B, "event": 7, "status": "delivered", "body": '{"id": 7}'}])
    engine.dispose()

    store = open_store(db)
    try:
        log = EventLog(store, settle_seconds=0)
        assert [e["id"] for e in log.after(A, 0)[0]] == [1, 2]  # ids 2 and 4
        assert [e["id"] for e in log.after(B, 0)[0]] == [1, 2]  # ids 3 and 5
        assert (log.head(A), log.head(B), log.head("gone")) == (2, 2, 0)
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT event_id, status, body FROM webhook_deliveries "
                                     "ORDER BY id")).all()
        assert [(r[0], r[1]) for r in rows] == [(2, "pending"), (1, "delivered"),
                                                (7, "delivered")]
        assert json.loads(rows[0][2]) == {"id": 2, "type": "quota.exceeded"}
        # New events go on from each team's number, and from the log's newest id ever
        # (7, pruned: the migration did not start SQLite's AUTOINCREMENT over).
        assert log.record(A, "quota.exceeded", limit="new") == 3
        assert log.after(A, 2, global_ids=True)[0][-1]["id"] == 8
    finally:
        store.close()


def test_concurrent_first_admits_of_a_new_team_all_land(store: Store) -> None:
    """Four first admits of a team the store has never seen: each takes the team's lock in
    turn (on PostgreSQL the second used to fail on the teams primary key)."""
    writers = 4
    start = threading.Barrier(writers)
    failed: list[BaseException] = []

    def admit(n: int) -> None:
        start.wait()
        try:
            store.admit([sandbox(f"sbx-{n + 100:012x}", "team-new")])
        except BaseException as e:  # reported below, from the test's thread
            failed.append(e)

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed == []
    got, _ = EventLog(store, settle_seconds=0).after("team-new", 0, limit=100)
    assert len(got) == writers
