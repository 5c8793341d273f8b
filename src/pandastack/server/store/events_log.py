"""Reading and pruning the event log, and the webhook tables' queries (the delivery queue).

A team reads its events by their team number (`seq`), an admin key by the global `id`.
Global ids order the log, but on PostgreSQL a transaction may take id 10, then another take
11 and commit first: a reader that saw 11 and moved its cursor past 10 would never see 10.
Global readers (admin streams, the webhook fan-out) therefore stop at the first event
younger than `settle_seconds` (on PostgreSQL; SQLite's one writer commits in id order): an
event's transaction commits well within that of the flush that wrote it. A team's numbers
need no such wait: the team's `event_sequences` row stays locked until the transaction that
took a number ends, so they commit in order."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from pandastack.wire.events import type_matches

from .events import (
    DeliverySequence,
    Event,
    EventMark,
    EventSequence,
    Webhook,
    WebhookDelivery,
    new_event,
    take_numbers,
)
from .repo import Store

#: How far a PostgreSQL reader stays behind the newest event (see the module's docstring).
PG_SETTLE_SECONDS = 1.0
READ_BATCH = 200


def wire_event(row: Event, global_ids: bool = False) -> dict[str, Any]:
    """The event as the API and webhooks send it: `id` is the team's number, or, for an
    admin key's reader (`global_ids`), the log's id with the team's number as `seq`."""
    ids = {"id": row.id, "seq": row.seq} if global_ids else {"id": row.seq}
    return {**(row.data or {}), **ids, "type": row.type, "time": row.time,
            "team": row.team, "actor": row.actor, "sandbox_id": row.sandbox_id,
            "template": row.template}


def matches(patterns: Sequence[str] | None, event_type: str) -> bool:
    return patterns is None or any(type_matches(p, event_type) for p in patterns)


@dataclass(frozen=True)
class Claimed:
    """A delivery a worker claimed: what it POSTs, and where. `id` is the store's (to record
    the attempt), `seq` the team's number the receiver is told."""

    id: int
    seq: int
    webhook_id: str
    url: str
    secret: str
    body: str
    event_type: str
    attempts: int
    created_at: float


class EventLog:
    """The log and the webhooks over a store."""

    def __init__(self, store: Store, settle_seconds: float | None = None) -> None:
        self.store = store
        if settle_seconds is None:
            pg = store.engine.dialect.name == "postgresql"
            settle_seconds = PG_SETTLE_SECONDS if pg else 0.0
        self.settle_seconds = settle_seconds

    # -- the log -----------------------------------------------------------------------

    def record(self, team: str, type_: str, *, who: str | None = None,
               sandbox_id: str | None = None, template: str | None = None,
               **data: Any) -> int:
        """An event that is no state change's (quota.exceeded), in its own transaction;
        returns its team number."""
        with self.store.session() as s:
            row = new_event(team, type_, sandbox_id=sandbox_id, template=template, who=who,
                            **data)
            s.add(row)
            s.flush()
            return row.seq

    def head(self, team: str | None = None) -> int:
        """The team's newest number, or (None) the log's newest id; 0 if there is none."""
        with self.store.session() as s:
            if team is None:
                return int(s.scalar(select(func.max(Event.id))) or 0)
            row = s.get(EventSequence, team)
            return 0 if row is None else int(row.last)

    def pruned_through(self, team: str | None = None) -> int:
        """The newest team number (or, None, global id) pruning removed. A team's numbers
        have no gaps (a number is taken in its event's transaction), and only pruning
        removes events: what is missing below the oldest kept was pruned."""
        with self.store.session() as s:
            if team is None:
                mark = s.get(EventMark, "pruned")
                return 0 if mark is None else int(mark.value)
            oldest = s.scalar(select(func.min(Event.seq)).where(Event.team == team))
            if oldest is not None:
                return int(oldest) - 1
            row = s.get(EventSequence, team)
            return 0 if row is None else int(row.last)

    def oldest(self, team: str, global_ids: bool = False) -> int | None:
        """The team's oldest event kept: its number, or its global id."""
        column = Event.id if global_ids else Event.seq
        with self.store.session() as s:
            value = s.scalar(select(func.min(column)).where(Event.team == team))
            return None if value is None else int(value)

    def _settled(self, rows: Sequence[Event], now: float) -> list[Event]:
        if self.settle_seconds <= 0:
            return list(rows)
        ready: list[Event] = []
        for row in rows:
            if row.time > now - self.settle_seconds:
                break
            ready.append(row)
        return ready

    def after(self, team: str, cursor: int, patterns: Sequence[str] | None = None,
              limit: int = READ_BATCH, now: float | None = None,
              global_ids: bool = False) -> tuple[list[dict[str, Any]], int]:
        """The team's events after `cursor` (matching `patterns`), and the cursor to read on
        from (past events read but filtered out, so a quiet filter does not read them again).
        Cursors are team numbers, or global ids (`global_ids`: an admin key's reader)."""
        column = Event.id if global_ids else Event.seq
        with self.store.session() as s:
            rows = list(s.scalars(select(Event).where(Event.team == team, column > cursor)
                                  .order_by(column).limit(limit)))
        if global_ids:
            rows = self._settled(rows, time.time() if now is None else now)
        out = [wire_event(r, global_ids) for r in rows if matches(patterns, r.type)]
        if not rows:
            return out, cursor
        return out, (rows[-1].id if global_ids else rows[-1].seq)

    def prune(self, before: float) -> int:
        """Drop events older than `before` and deliveries that finished before it; the
        newest dropped id is kept (`pruned_through`). Pending deliveries stay."""
        with self.store.session() as s:
            newest = s.scalar(select(func.max(Event.id)).where(Event.time < before))
            if newest is None:
                dropped = 0
            else:
                result = s.execute(delete(Event).where(Event.time < before))
                dropped = int(getattr(result, "rowcount", 0) or 0)
                mark = s.get(EventMark, "pruned", with_for_update=True)
                if mark is None:
                    s.add(EventMark(name="pruned", value=int(newest)))
                elif mark.value < newest:
                    mark.value = int(newest)
            s.execute(delete(WebhookDelivery).where(WebhookDelivery.status != "pending",
                                                    WebhookDelivery.finished_at < before))
            return dropped

    # -- webhooks ----------------------------------------------------------------------

    def add_webhook(self, row: Webhook, max_per_team: int) -> bool:
        """Insert `row` unless its team has `max_per_team` already (False then)."""
        with self.store.team_locked(row.team) as s:
            count = s.scalar(select(func.count()).select_from(Webhook)
                             .where(Webhook.team == row.team)) or 0
            if count >= max_per_team:
                return False
            s.add(row)
            return True

    def webhooks(self, team: str) -> list[Webhook]:
        with self.store.session() as s:
            return list(s.scalars(select(Webhook).where(Webhook.team == team)
                                  .order_by(Webhook.created_at)))

    def webhook(self, team: str, webhook_id: str) -> Webhook | None:
        with self.store.session() as s:
            row = s.get(Webhook, webhook_id)
            return row if row is not None and row.team == team else None

    def delete_webhook(self, team: str, webhook_id: str) -> bool:
        """Delete the team's webhook with its delivery log and queue."""
        with self.store.session() as s:
            row = s.get(Webhook, webhook_id)
            if row is None or row.team != team:
                return False
            s.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id))
            s.delete(row)
            return True

    def deliveries(self, webhook_id: str, limit: int = 100,
                   before: int | None = None) -> list[WebhookDelivery]:
        """The webhook's deliveries, newest first (by the team's number: `before` is one)."""
        q = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
        if before is not None:
            q = q.where(WebhookDelivery.seq < before)
        with self.store.session() as s:
            return list(s.scalars(q.order_by(WebhookDelivery.seq.desc()).limit(limit)))

    def delivery_number(self, team: str) -> int:
        """The team's next delivery number, taken now (a delivery that needs its number
        before its row is written: the test route's). One never written leaves a gap."""
        with self.store.session() as s:
            holder = WebhookDelivery(team=team)
            take_numbers(s, DeliverySequence, [holder])
            return holder.seq

    def add_delivery(self, row: WebhookDelivery) -> WebhookDelivery:
        """Insert `row`, numbered in its team's sequence unless it has its number."""
        with self.store.session() as s:
            if row.seq is None:
                take_numbers(s, DeliverySequence, [row])
            s.add(row)
        return row

    def fan_out(self, now: float, limit: int = 500) -> int:
        """Queue a delivery of each event past the `fanout` mark to each of its team's
        webhooks that takes its type and existed when it happened; returns how many were
        queued. The mark moves in the same transaction (a restart resumes from it)."""
        with self.store.session() as s:
            mark = s.get(EventMark, "fanout", with_for_update=True)
            if mark is None:
                mark = EventMark(name="fanout", value=0)
                s.add(mark)
                s.flush()
            rows = self._settled(list(s.scalars(
                select(Event).where(Event.id > mark.value).order_by(Event.id).limit(limit))),
                now)
            if not rows:
                return 0
            hooks = self._hooks_of(s, {r.team for r in rows})
            queued: list[WebhookDelivery] = []
            for row in rows:
                for hook in hooks.get(row.team, ()):
                    if hook.created_at <= row.time and matches(hook.events, row.type):
                        queued.append(WebhookDelivery(
                            webhook_id=hook.id, team=row.team, event_id=row.seq,
                            event_type=row.type, status="pending", attempts=0,
                            body=json.dumps(wire_event(row), separators=(",", ":")),
                            created_at=now, next_attempt_at=now))
            take_numbers(s, DeliverySequence, queued)
            s.add_all(queued)
            mark.value = rows[-1].id
            return len(queued)

    @staticmethod
    def _hooks_of(s: Session, teams: set[str]) -> dict[str, list[Webhook]]:
        found: dict[str, list[Webhook]] = {}
        for hook in s.scalars(select(Webhook).where(Webhook.team.in_(sorted(teams)))):
            found.setdefault(hook.team, []).append(hook)
        return found

    def finish_attempt(self, delivery_id: int, *, now: float, delivered: bool,
                       response_status: int | None, error: str | None,
                       retry_at: float | None) -> None:
        """Record one attempt: delivered, retried at `retry_at`, or failed for good (None)."""
        with self.store.session() as s:
            row = s.get(WebhookDelivery, delivery_id, with_for_update=True)
            if row is None:
                return
            row.response_status = response_status
            row.error = None if delivered else (error or "")[:1000]
            if delivered or retry_at is None:
                row.status = "delivered" if delivered else "failed"
                row.finished_at = now
                row.next_attempt_at = None
            else:
                row.next_attempt_at = retry_at
