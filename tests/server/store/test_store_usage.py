"""Usage segments and quotas in the store, on real SQLite and a real PostgreSQL (the `db`
fixture): every state write opens and closes segments in its own transaction; a second
Store on the same database (a restarted server) neither loses nor doubles an interval; the
report clips, groups and splits at UTC midnight; two creates racing at max_sandboxes=1 from
two threads let exactly one through."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select

from pandastack.server.accounts.metering import Rates, summarize
from pandastack.server.accounts.quotas import Quotas
from pandastack.server.settings import Settings
from pandastack.server.store import Sandbox, Snapshot, Store, open_store
from pandastack.server.store.models import UsageSegment
from pandastack.server.store.usage import close_volume_segment, open_volume_segment
from pandastack.server.web.errors import ApiError

TEAM = "t1"


def new_row(sid: str, state: str = "starting", *, vcpus: int = 2, memory_mb: int = 1024,
            disk_mb: int | None = None, team: str = TEAM) -> Sandbox:
    now = time.time()
    return Sandbox(id=sid, team=team, template="base", state=state, created_at=now,
                   expires_at=now + 60, ttl_seconds=60, persistent=False, vcpus=vcpus,
                   memory_mb=memory_mb, disk_mb=disk_mb, env={}, meta={},
                   last_activity_at=now, ended_at=None, end_reason=None)


def segments(store: Store, subject: str) -> list[UsageSegment]:
    with store.session() as s:
        return list(s.scalars(select(UsageSegment).where(UsageSegment.subject_id == subject)
                              .order_by(UsageSegment.id)))


def open_kinds(store: Store, subject: str) -> list[str]:
    return sorted(seg.kind for seg in segments(store, subject) if seg.ended_at is None)


def test_every_state_write_opens_and_closes_segments(store: Store) -> None:
    sid = "sbx-000000000001"
    store.admit([new_row(sid)])
    assert segments(store, sid) == []  # starting holds nothing yet
    store.update_sandbox(sid, state="running", created_at=time.time())
    assert open_kinds(store, sid) == ["compute", "disk"]
    store.set_live_state(sid, "paused")  # paused still holds its memory and vCPUs
    assert open_kinds(store, sid) == ["compute", "disk"] and len(segments(store, sid)) == 2
    store.set_live_state(sid, "hibernated")
    assert open_kinds(store, sid) == ["disk"]
    store.set_live_state(sid, "running")
    assert open_kinds(store, sid) == ["compute", "disk"]
    store.set_live_state(sid, "running")  # a repeated write (a re-sync) opens nothing
    assert len(segments(store, sid)) == 3
    row = store.end_sandbox(sid, "killed", "test")
    assert row is not None and row.ended_at is not None
    segs = segments(store, sid)
    assert [s.kind for s in segs] == ["compute", "disk", "compute"]
    assert all(s.ended_at is not None for s in segs)
    assert segs[-1].ended_at == row.ended_at == segs[1].ended_at  # the time of that write
    compute = [s for s in segs if s.kind == "compute"]
    assert all(s.vcpus == 2 and s.memory_mb == 1024 for s in compute)
    assert segs[1].gib == 2.0  # no disk_mb: the template's 2 GiB rootfs
    store.end_sandbox(sid, "failed", "again")  # an ended row is left alone
    assert len(segments(store, sid)) == 3


def test_lost_hosts_forks_and_snapshots(store: Store) -> None:
    sid, child = "sbx-000000000002", "sbx-000000000003"
    store.admit([new_row(sid, disk_mb=4096)])
    store.update_sandbox(sid, state="running", host_id="host-a")
    assert [s.gib for s in segments(store, sid) if s.kind == "disk"] == [4.0]
    assert store.mark_host_lost(["host-a"]) == [sid]
    assert open_kinds(store, sid) == []
    store.update_sandbox(sid, state="running", host_id="host-b")  # restored elsewhere
    assert open_kinds(store, sid) == ["compute", "disk"]
    store.admit([new_row(child, "running")])  # a fork's child is born running
    assert open_kinds(store, child) == ["compute", "disk"]
    snap = Snapshot(id="snap-000000000001", team=TEAM, name=None, source_sandbox=sid,
                    template="base", created_at=time.time(), vcpus=2, memory_mb=1024,
                    disk_mb=None, size_bytes=3 << 29, deleted_at=None)
    store.add_snapshot(snap)
    [seg] = segments(store, snap.id)
    assert seg.kind == "snapshot" and seg.gib == 1.5 and seg.sandbox_id == sid
    store.delete_snapshot(snap.id)
    assert segments(store, snap.id)[0].ended_at is not None
    with store.session() as s:
        open_volume_segment(s, TEAM, "vol-000000000001", 2048, 100.0)
    with store.session() as s:  # a resize: the old size ends, the new one starts
        close_volume_segment(s, "vol-000000000001", 200.0)
        open_volume_segment(s, TEAM, "vol-000000000001", 4096, 200.0)
    vol = segments(store, "vol-000000000001")
    assert [(v.gib, v.started_at, v.ended_at) for v in vol] == [(2.0, 100.0, 200.0),
                                                                 (4.0, 200.0, None)]


def test_a_restarted_server_loses_and_doubles_nothing(db: str) -> None:
    sid = "sbx-000000000004"
    first = open_store(db)
    try:
        first.admit([new_row(sid)])
        first.update_sandbox(sid, state="running")
        opened = segments(first, sid)
    finally:
        first.close()  # the server goes away with the sandbox running
    second = open_store(db)
    try:
        assert [(s.id, s.ended_at) for s in segments(second, sid)] == [
            (s.id, None) for s in opened]
        second.set_live_state(sid, "running")  # the restart's reconcile re-syncs the row
        second.update_sandbox(sid, state="running")
        assert len(segments(second, sid)) == 2
        row = second.end_sandbox(sid, "failed", "VM gone after a server restart")
        assert row is not None
        segs = segments(second, sid)
        assert len(segs) == 2 and {s.ended_at for s in segs} == {row.ended_at}
        assert [s.started_at for s in segs] == [s.started_at for s in opened]
    finally:
        second.close()


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_report_clips_groups_and_splits_days(store: Store) -> None:
    day1, day2 = at("2026-03-01T00:00:00"), at("2026-03-02T00:00:00")
    rows = [  # (team, kind, subject, sandbox, template, vcpus, memory, gib, start, end)
        ("a", "compute", "sbx-a", "sbx-a", "base", 2, 1024, 0.0, day2 - 600, day2 + 600),
        ("a", "disk", "sbx-a", "sbx-a", "base", 0, 0, 2.0, day2 - 600, None),
        ("a", "compute", "sbx-b", "sbx-b", "py", 1, 512, 0.0, day1 + 100, day1 + 200),
        ("a", "volume", "vol-a", None, None, 0, 0, 1.0, day1, day1 + 1000),
        ("a", "snapshot", "snap-a", "sbx-a", "base", 0, 0, 0.5, day1 + 50, day1 + 150),
        ("b", "compute", "sbx-c", "sbx-c", "base", 4, 4096, 0.0, day1, day1 + 10),
        ("a", "compute", "sbx-old", "sbx-old", "base", 8, 8192, 0.0, day1 - 500, day1 - 1),
    ]
    with store.session() as s:
        for team, kind, subject, sbx, template, vcpus, memory, gib, lo, hi in rows:
            s.execute(insert(UsageSegment).values(
                team=team, kind=kind, subject_id=subject, sandbox_id=sbx, template=template,
                vcpus=vcpus, memory_mb=memory, gib=gib, started_at=lo, ended_at=hi))
    rates = Rates()
    now = day2 + 1200
    segs = store.usage_segments("a", day1, now)
    assert {s.subject_id for s in segs} == {"sbx-a", "sbx-b", "vol-a", "snap-a"}
    by_sbx, totals = summarize(segs, day1, now, now, "sandbox", rates)
    got = {(r.sandbox_id, r.volume_id): r for r in by_sbx}
    a = got[("sbx-a", None)]
    assert a.vcpu_seconds == 2 * 1200 and a.memory_gib_seconds == 1200
    assert a.disk_gib_seconds == 2.0 * 1800  # still open: counts up to now
    assert a.snapshot_gib_seconds == 0.5 * 100 and a.template == "base"
    assert got[("sbx-b", None)].vcpu_seconds == 100
    assert got[(None, "vol-a")].volume_gib_seconds == 1000
    assert totals.vcpu_seconds == 2500
    assert totals.cost_usd == pytest.approx(rates.cost(totals))
    assert a.cost_usd == pytest.approx(2400 * rates.vcpu_second + 1200 * rates.memory_gib_second
                                       + 3600 * rates.disk_gib_second
                                       + 50 * rates.snapshot_gib_second)
    # clipped to a window inside sbx-a's compute segment
    clipped, _ = summarize(store.usage_segments("a", day2 - 60, day2 + 60), day2 - 60,
                           day2 + 60, now, "sandbox", rates)
    assert [r.vcpu_seconds for r in clipped if r.sandbox_id == "sbx-a"] == [240]
    days, _ = summarize(segs, day1, now, now, "day", rates)
    per_day = {r.day: r for r in days}
    assert set(per_day) == {"2026-03-01", "2026-03-02"}
    assert per_day["2026-03-01"].vcpu_seconds == 2 * 600 + 100  # split at midnight
    assert per_day["2026-03-02"].vcpu_seconds == 2 * 600
    templates, _ = summarize(segs, day1, now, now, "template", rates)
    assert {r.template: r.vcpu_seconds for r in templates} == {None: 0, "base": 2400,
                                                               "py": 100}
    everyone, _ = summarize(store.usage_segments(None, day1, now), day1, now, now, "template",
                            rates)
    assert {(r.team, r.template) for r in everyone} >= {("a", "base"), ("b", "base")}


def test_two_racing_creates_at_max_sandboxes_1_let_exactly_one_through(db: str) -> None:
    stores = [open_store(db), open_store(db)]  # two API servers on one database
    try:
        stores[0].set_quota("race", {"max_sandboxes": 1})
        start = threading.Barrier(2)
        passed: list[str] = []
        refused: list[ApiError] = []
        failed: list[BaseException] = []

        def create(i: int) -> None:
            quotas = Quotas(stores[i], Settings())
            real = quotas.admission([(1, 512)])

            def slow_check(s: object, team: str) -> None:
                real(s, team)  # type: ignore[arg-type]
                time.sleep(0.5)  # without the team's lock, the other would pass meanwhile

            start.wait()
            sid = f"sbx-00000000010{i}"
            try:
                stores[i].admit([new_row(sid, team="race", vcpus=1, memory_mb=512)],
                                slow_check)
                passed.append(sid)
            except ApiError as exc:
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
        err = refused[0]
        assert (err.status, err.code) == (429, "quota_exceeded")
        assert err.details == {"limit": "max_sandboxes", "value": 1, "current": 1}
        assert [r.id for r in stores[1].list_sandboxes("race")] == passed  # nothing half-made
        # a hibernated sandbox does not count; waking it would
        stores[0].update_sandbox(passed[0], state="running")
        stores[0].set_live_state(passed[0], "hibernated")
        quotas = Quotas(stores[0], Settings())
        stores[0].admit([new_row("sbx-000000000110", team="race", vcpus=1, memory_mb=512)],
                        quotas.admission([(1, 512)]))
        with pytest.raises(ApiError) as wake:
            stores[0].check_quota("race", quotas.admission([(1, 512)]))
        assert wake.value.details["limit"] == "max_sandboxes"
    finally:
        for s in stores:
            s.close()


def test_limits_budget_and_volume_quota(store: Store) -> None:
    settings = Settings(quota_defaults=Settings().quota_defaults.__class__(max_vcpus=4))
    quotas = Quotas(store, settings)
    store.admit([new_row("sbx-000000000201", "running", vcpus=2)], quotas.admission([(2, 1024)]))
    with pytest.raises(ApiError) as exc:  # the server's default: 4 vCPUs
        store.check_quota(TEAM, quotas.admission([(4, 1024)]))
    assert exc.value.details == {"limit": "max_vcpus", "value": 4, "current": 2}
    store.set_quota(TEAM, {"max_vcpus": None, "max_memory_mb": 1500})
    info = quotas.info(TEAM)
    assert info.max_vcpus == 4 and info.max_memory_mb == 1500 and "max_vcpus" in info.defaults
    assert (info.usage.sandboxes, info.usage.vcpus, info.usage.memory_mb) == (1, 2, 1024)
    with pytest.raises(ApiError) as exc:
        store.check_quota(TEAM, quotas.admission([(1, 512)]))
    assert exc.value.details["limit"] == "max_memory_mb"
    store.set_quota(TEAM, {"max_memory_mb": None, "monthly_budget_usd": 0.0})
    with pytest.raises(ApiError) as exc:  # spent >= a budget of 0
        store.check_quota(TEAM, quotas.admission([(1, 512)]))
    assert exc.value.details["limit"] == "monthly_budget_usd"
    store.set_quota(TEAM, {"monthly_budget_usd": None, "max_volume_gb": 3})
    with store.session() as s:
        open_volume_segment(s, TEAM, "vol-000000000002", 2048, time.time())
    with store.session() as s:
        quotas.check_volume(s, TEAM, 1024)  # 3 GiB: at the limit, not over it
        with pytest.raises(ApiError) as exc:
            quotas.check_volume(s, TEAM, 1025)
    assert exc.value.details == {"limit": "max_volume_gb", "value": 3, "current": 2.0}
    assert quotas.info(TEAM).usage.volume_gb == 2.0
