"""The event log's tables and how events get into them.

Sandbox, snapshot and template build events are written by a `before_flush` hook on every
session: a flush that changes a sandbox's state, inserts fork children or a snapshot, or
moves a build's status adds the event rows to the same flush, so an event commits (or rolls
back) with the state change it tells of, whichever store method made it. Who did it comes
from the request (`caller`, set by the API key dependency); outside a request it is
"system" (the reaper, TTL expiry, startup reconciliation).

The same hook numbers each event in its team's own sequence (`seq`, from the team's
`event_sequences` row, bumped in the event's transaction): a team's ids tell nothing of
other teams' activity, which the global `id` would (ADR 0035, addendum)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    event,
    insert,
    inspect,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Mapped, Session, mapped_column
from sqlalchemy.sql.dml import ReturningInsert

from pandastack.registry.models import Base
from pandastack.wire.sandboxes import ENDED_STATES

from .models import Sandbox, Snapshot, TemplateVersion

SYSTEM = "system"


class Event(Base):
    """One event of the log. `id` orders the whole log (autoincrement, never reused: SQLite's
    AUTOINCREMENT, PostgreSQL's sequence; only admin keys see it); `seq` orders the team's
    events (1, 2, 3, ... without gaps: the team's ids); `data` holds the type's own fields."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_team_id", "team", "id"),
                      Index("ix_events_team_seq", "team", "seq", unique=True),
                      Index("ix_events_time", "time"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(BigInteger)
    type: Mapped[str] = mapped_column(String(48))
    time: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(64))
    sandbox_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    template: Mapped[str | None] = mapped_column(String(160), nullable=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


EVENTS = cast(Table, Event.__table__)
#: What an event row is written with (its `id` is the database's).
EVENT_COLUMNS = [attr for attr in inspect(Event).column_attrs if attr.key != "id"]


class EventSequence(Base):
    """A team's last event `seq`. Bumped in the transaction that writes the team's events,
    so its row lock (PostgreSQL) holds the team's next writer until that transaction ends:
    no two events of a team share a number, and a team's events commit in `seq` order."""

    __tablename__ = "event_sequences"

    team: Mapped[str] = mapped_column(String(128), primary_key=True)
    last: Mapped[int] = mapped_column(BigInteger)


class Webhook(Base):
    """A team's webhook. The secret is kept as given out: every delivery is signed with it
    (as the server's URL signing key, it lives in the database)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_team", "team"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    description: Mapped[str | None] = mapped_column(String(256), nullable=True)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)


class WebhookDelivery(Base):
    """One event (or test) to POST to one webhook: the durable delivery queue and its log.
    `status` pending until it is delivered or its retry window ends (failed); a pending
    row is due at `next_attempt_at` (a worker claiming it pushes that past its attempt).
    `id` is the store's own; `seq` is the team's number for it (`X-Pandastack-Delivery`, the
    log's `id`): a global id would tell a team how many deliveries the others get."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
                      Index("ix_webhook_deliveries_webhook_seq", "webhook_id", "seq"),
                      Index("ix_webhook_deliveries_team_seq", "team", "seq", unique=True),
                      {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    webhook_id: Mapped[str] = mapped_column(String(32))
    team: Mapped[str] = mapped_column(String(128))
    event_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    event_type: Mapped[str] = mapped_column(String(48))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeliverySequence(Base):
    """A team's last webhook delivery `seq`, taken as `event_sequences` are (`take_numbers`)."""

    __tablename__ = "webhook_delivery_sequences"

    team: Mapped[str] = mapped_column(String(128), primary_key=True)
    last: Mapped[int] = mapped_column(BigInteger)


class EventMark(Base):
    """Named positions in the log: `fanout` (the last event the webhook fan-out handled)
    and `pruned` (the newest id pruning removed: a resume point before it lost events)."""

    __tablename__ = "event_marks"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


# -- who is acting ------------------------------------------------------------------------

@dataclass
class Caller:
    """The request's caller, filled in by the auth dependency. One mutable object per
    request, so that a worker thread's copy of the context sees the same one."""

    key_id: str | None = None
    team: str | None = None
    quota_events: list[dict[str, Any]] = field(default_factory=list)


caller: ContextVar[Caller | None] = ContextVar("pandastack_event_caller", default=None)
_fork_parent: ContextVar[str | None] = ContextVar("pandastack_fork_parent", default=None)


def actor() -> str:
    who = caller.get()
    return who.key_id if who is not None and who.key_id else SYSTEM


def note_caller(key_id: str, team: str) -> None:
    """The auth dependency's hook: this request acts as `key_id` of `team`."""
    who = caller.get()
    if who is not None:
        who.key_id, who.team = key_id, team


@contextlib.contextmanager
def forking(parent_id: str) -> Iterator[None]:
    """Sandbox rows inserted running inside this block are children of a fork of
    `parent_id` (one `sandbox.forked` event names them all)."""
    token = _fork_parent.set(parent_id)
    try:
        yield
    finally:
        _fork_parent.reset(token)


# -- what a change is ---------------------------------------------------------------------

_MOVES = {("starting", "running"): "sandbox.created", ("running", "paused"): "sandbox.paused",
          ("paused", "running"): "sandbox.resumed", ("hibernated", "running"): "sandbox.woken",
          ("hibernated", "paused"): "sandbox.woken", ("host_lost", "running"): "sandbox.woken",
          ("running", "hibernated"): "sandbox.hibernated",
          ("paused", "hibernated"): "sandbox.hibernated",
          ("running", "stopped"): "sandbox.stopped", ("paused", "stopped"): "sandbox.stopped",
          ("hibernated", "stopped"): "sandbox.stopped", ("stopped", "running"): "sandbox.woken"}


def _sandbox_event(row: Sandbox, old: str | None, new: str) -> str | None:
    if new in ENDED_STATES:
        return f"sandbox.{new}"
    if new == "host_lost":
        return "sandbox.host_lost"
    return _MOVES.get((old or "", new))


def _state_change(row: Sandbox) -> tuple[str | None, str] | None:
    hist = inspect(row).attrs.state.history
    if not hist.added:
        return None
    old = hist.deleted[0] if hist.deleted else None
    new = hist.added[-1]
    return None if old == new else (old, new)


def new_event(team: str, type_: str, *, sandbox_id: str | None = None,
              template: str | None = None, who: str | None = None,
              **data: Any) -> Event:
    return Event(team=team, type=type_, time=time.time(), actor=who or actor(),
                 sandbox_id=sandbox_id, template=template, data=data)


def _sandbox_row_event(row: Sandbox, old: str | None, new: str) -> Event | None:
    kind = _sandbox_event(row, old, new)
    if kind is None:
        return None
    data: dict[str, Any] = {"state": new, "previous_state": old}
    if new in ENDED_STATES or new == "host_lost":
        data["reason"] = row.end_reason if new in ENDED_STATES else "its host stopped heartbeating"
    if new == "host_lost":
        data["host_id"] = row.host_id
    if kind == "sandbox.created":
        data.update(name=row.name, vcpus=row.vcpus, memory_mb=row.memory_mb,
                    snapshot=row.snapshot, metadata=dict(row.meta or {}))
    if old == "host_lost":
        data["restored_on"] = row.host_id
    if new == "stopped":
        data["reason"] = row.stop_reason
    if old == "stopped":
        data["restored_from"] = row.restored_from
    return new_event(row.team, kind, sandbox_id=row.id, template=row.template, **data)


def _build_event(row: TemplateVersion, old: str | None) -> Event | None:
    kind = {"building": "template.build.started", "ready": "template.build.succeeded",
            "failed": "template.build.failed"}.get(row.status)
    if kind is None or old == row.status:
        return None
    data: dict[str, Any] = {"build_id": row.id, "name": row.name, "version": row.version}
    if row.status == "failed":
        data["error"] = row.error
    if row.status == "ready":
        data.update(steps_total=row.steps_total, steps_cached=row.steps_cached)
    return new_event(row.team, kind, template=f"{row.name}:{row.version}", **data)


def events_of_flush(session: Session) -> list[Event]:
    found: list[Event] = []
    children: dict[str, list[Sandbox]] = {}
    for obj in list(session.new):
        if isinstance(obj, Sandbox):
            if obj.state == "starting":
                continue  # told when it is running (sandbox.created) or failed
            parent = _fork_parent.get()
            if parent is not None and obj.state == "running":
                children.setdefault(obj.team, []).append(obj)
            else:
                made = _sandbox_row_event(obj, "starting", obj.state)
                if made is not None:
                    found.append(made)
        elif isinstance(obj, Snapshot):
            found.append(new_event(obj.team, "sandbox.snapshotted",
                                   sandbox_id=obj.source_sandbox, template=obj.template,
                                   snapshot_id=obj.id, name=obj.name,
                                   size_bytes=obj.size_bytes))
        elif isinstance(obj, TemplateVersion):
            made = _build_event(obj, None)
            if made is not None:
                found.append(made)
    for team, rows in children.items():
        found.append(new_event(team, "sandbox.forked", sandbox_id=_fork_parent.get(),
                               template=rows[0].template, parent=_fork_parent.get(),
                               children=[r.id for r in rows]))
    for obj in list(session.dirty):
        if isinstance(obj, Sandbox):
            change = _state_change(obj)
            if change is not None:
                made = _sandbox_row_event(obj, *change)
                if made is not None:
                    found.append(made)
        elif isinstance(obj, TemplateVersion):
            hist = inspect(obj).attrs.status.history
            if hist.added:
                made = _build_event(obj, hist.deleted[0] if hist.deleted else None)
                if made is not None:
                    found.append(made)
    return found


@functools.cache
def _bump_statement(counter: type[EventSequence] | type[DeliverySequence],
                    pg: bool) -> ReturningInsert[Any]:
    """The upsert that takes a team's next `bump_n` numbers, built once: every state change
    runs it, and building it (and its cache key) each time cost more than running it."""
    made = (pg_insert if pg else sqlite_insert)(counter).values(
        team=bindparam("bump_team"), last=bindparam("bump_n", type_=BigInteger))
    return made.on_conflict_do_update(
        index_elements=[counter.team],
        set_={"last": counter.last + bindparam("bump_n", type_=BigInteger)},
    ).returning(counter.last)


def take_numbers(session: Session, counter: type[EventSequence] | type[DeliverySequence],
                 rows: list[Event] | list[WebhookDelivery]) -> None:
    """Give `rows` the next numbers of their teams' sequences in `counter`, in list order.
    The counter's row stays locked (PostgreSQL) until the transaction ends."""
    by_team: dict[str, list[Any]] = {}
    for row in rows:
        by_team.setdefault(row.team, []).append(row)
    # On the session's connection, not through the session (it may be mid-flush).
    conn = session.connection()
    stmt = _bump_statement(counter, conn.dialect.name == "postgresql")
    # Teams in one order: two transactions that each number rows of teams A and B take the
    # rows' locks alike, never A-then-B against B-then-A.
    for team in sorted(by_team):
        mine = by_team[team]
        last = int(conn.execute(stmt, {"bump_team": team, "bump_n": len(mine)}).scalar_one())
        for n, row in enumerate(mine, start=last - len(mine) + 1):
            row.seq = n


def number_events(session: Session, rows: list[Event]) -> None:
    """Give `rows` the next numbers of their teams' event sequences, in list order."""
    take_numbers(session, EventSequence, rows)


def record_state_change(session: Session, row: Sandbox, old: str, new: str) -> None:
    """The event of `row`'s move from `old` to `new`, numbered and inserted in `session`'s
    transaction, for a writer that changed the state with a Core UPDATE (no flush for the
    hook below to see): the same event the hook would have written."""
    made = _sandbox_row_event(row, old, new)
    if made is None:
        return
    number_events(session, [made])
    session.execute(insert(EVENTS), [{column.key: getattr(made, column.key)
                                      for column in EVENT_COLUMNS}])


@event.listens_for(Session, "before_flush")
def _record_events(session: Session, _context: object, _instances: object) -> None:
    # Only the control plane's rows make events: an agent's sessions (hosts, leases) find
    # none of these among their objects.
    if not session.new and not session.dirty:
        return
    made = events_of_flush(session)
    added = [o for o in session.new if isinstance(o, Event) and o.seq is None]
    if added or made:
        number_events(session, added + made)
    if made:
        session.add_all(made)


def note_quota_exceeded(team: str, **data: Any) -> None:
    """A quota check refused something: its transaction rolls back, so the event is kept
    on the request and written after it (`server/events/log.py`'s middleware)."""
    who = caller.get()
    if who is not None:
        who.quota_events.append({"team": team, "actor": who.key_id or SYSTEM, **data})
