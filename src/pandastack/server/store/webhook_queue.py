"""Claiming due webhook deliveries team by team, so that one team's backlog or slow
endpoint never takes the places another team's deliveries need (issue 33). A worker says
how many attempts it has room for in all and per team (what it already runs counted); each
team gets at most its share, teams whose deliveries have waited longest first."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, select

from .events import Webhook, WebhookDelivery
from .events_log import Claimed
from .repo import Store

#: Teams looked at in one claim (the ones waiting longest); the rest come in the next.
TEAMS_PER_CLAIM = 256


def claim_due_by_team(store: Store, now: float, *, room: int, per_team: int,
                      running: Mapping[str, int],
                      lease_seconds: float) -> list[tuple[str, Claimed]]:
    """(team, delivery) for up to `room` due deliveries, at most `per_team` minus what
    `running` says a team has in flight. Each is pushed `lease_seconds` ahead and counts one
    more attempt (a worker that dies mid-attempt leaves it to be retried then); rows another
    server holds are skipped, not waited for."""
    if room <= 0:
        return []
    pending_due = (WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
    claimed: list[tuple[str, Claimed]] = []
    with store.session() as s:
        teams = list(s.scalars(
            select(WebhookDelivery.team).where(*pending_due).group_by(WebhookDelivery.team)
            .order_by(func.min(WebhookDelivery.next_attempt_at)).limit(TEAMS_PER_CLAIM)))
        for team in teams:
            free = min(per_team - running.get(team, 0), room - len(claimed))
            if free <= 0:
                if len(claimed) >= room:
                    break
                continue
            rows = list(s.scalars(
                select(WebhookDelivery).where(WebhookDelivery.team == team, *pending_due)
                .order_by(WebhookDelivery.next_attempt_at).limit(free)
                .with_for_update(skip_locked=True)))
            hooks = {h.id: h for h in s.scalars(select(Webhook).where(
                Webhook.id.in_(sorted({r.webhook_id for r in rows}))))} if rows else {}
            for row in rows:
                hook = hooks.get(row.webhook_id)
                if hook is None:  # deleted under us: its rows go with it
                    continue
                row.attempts += 1
                row.next_attempt_at = now + lease_seconds
                claimed.append((team, Claimed(row.id, row.seq, hook.id, hook.url, hook.secret,
                                              row.body, row.event_type, row.attempts,
                                              row.created_at)))
    return claimed
