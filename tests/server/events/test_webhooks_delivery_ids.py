"""Webhook delivery ids are the team's own numbers (issue 33): `X-Pandastack-Delivery` and
the delivery log's `id` tell a team nothing of how many deliveries other teams get. Real
stores (SQLite and PostgreSQL), a real receiver on 127.0.0.1, concurrent numbering, and a
database from before the numbers migrated."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import text

from pandastack.server.events.webhooks import WebhookService
from pandastack.server.store import Store, open_store
from pandastack.server.store.db import make_engine
from pandastack.server.store.events import WebhookDelivery
from pandastack.server.store.events_log import EventLog
from pandastack.wire.events import WebhookCreate
from tests.server.conftest import make_settings
from tests.server.store.test_store_migrations import upgrade_to
from tests.server.webhook_receiver import receiver

A, B = "team-a", "team-b"


async def test_a_teams_delivery_ids_count_only_its_own(store: Store, tmp_path: Path) -> None:
    """Team A gets five deliveries, then team B one and a test: B is told 1 and 2 (a global
    sequence said 6 and 7, or 0 for a test), in the header and in its log alike."""
    svc = WebhookService(EventLog(store, settle_seconds=0),
                         make_settings(tmp_path, webhook_allow_private=True))
    with receiver() as r:
        try:
            a_hook, _ = await svc.create(A, WebhookCreate(url=f"{r.url}/a", events=["*"]))
            b_hook, _ = await svc.create(B, WebhookCreate(url=f"{r.url}/b", events=["*"]))
            for n in range(5):
                svc.events.record(A, "quota.exceeded", limit=f"a{n}")
            assert await svc.tick() + await svc.tick() == 5  # a team's lane takes 4 a pass
            svc.events.record(B, "quota.exceeded", limit="b")
            assert await svc.tick() == 1
            test = await svc.test(b_hook)
            got = r.wait_for(7)
        finally:
            await svc.aclose()
    header = {(g.path, int(g.headers["X-Pandastack-Delivery"])) for g in got}
    assert header == {*(("/hook/a", n) for n in range(1, 6)), ("/hook/b", 1), ("/hook/b", 2)}
    assert [d.seq for d in svc.events.deliveries(b_hook.id)] == [2, 1]
    assert (test.seq, test.event_type, test.status) == (2, "webhook.test", "delivered")
    assert [d.seq for d in svc.events.deliveries(a_hook.id)] == [5, 4, 3, 2, 1]
    # Pages go by the team's numbers.
    assert [d.seq for d in svc.events.deliveries(a_hook.id, limit=2, before=4)] == [3, 2]


def test_concurrent_deliveries_of_a_team_never_share_a_number(store: Store) -> None:
    log = EventLog(store, settle_seconds=0)
    writers = 4
    start = threading.Barrier(writers)
    failed: list[BaseException] = []

    def add(n: int) -> None:
        start.wait()
        try:
            for _ in range(5):
                log.add_delivery(WebhookDelivery(
                    webhook_id="wh_x", team=A, event_id=None, event_type="webhook.test",
                    body="{}", status="delivered", attempts=1, created_at=time.time()))
            log.delivery_number(A)  # a number taken and never written: a gap, no reuse
        except BaseException as e:  # reported below, from the test's thread
            failed.append(e)

    threads = [threading.Thread(target=add, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed == []
    seqs = [d.seq for d in log.deliveries("wh_x", limit=100)]
    assert len(seqs) == len(set(seqs)) == 20
    assert log.delivery_number(A) == 25 and log.delivery_number(B) == 1


def test_an_old_database_numbers_its_deliveries_per_team_in_id_order(db: str) -> None:
    upgrade_to(db, "0015")
    engine = make_engine(db)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO webhook_deliveries (id, webhook_id, team, event_id, "
                          "event_type, body, status, attempts, created_at) VALUES "
                          "(:id, :hook, :team, NULL, 'webhook.test', '{}', 'delivered', 1, "
                          "1.0)"),
                     [{"id": i, "hook": f"wh_{t}", "team": t} for i, t in (
                         (1, A), (2, B), (3, A), (4, A), (5, B))])
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT setval('webhook_deliveries_id_seq', 5)"))
    engine.dispose()

    store = open_store(db)
    try:
        log = EventLog(store, settle_seconds=0)
        assert [(d.id, d.seq) for d in log.deliveries(f"wh_{A}")] == [(4, 3), (3, 2), (1, 1)]
        assert [(d.id, d.seq) for d in log.deliveries(f"wh_{B}")] == [(5, 2), (2, 1)]
        # New ones go on from each team's number.
        assert log.delivery_number(A) == 4 and log.delivery_number(B) == 3
        assert log.delivery_number("new-team") == 1
    finally:
        store.close()
