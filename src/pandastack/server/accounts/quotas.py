"""Team quotas and size classes: the checks the service runs before it admits a sandbox
(create, fork, wake, restart, restore) or a hibernation, the one volumes run before they
grow, the one a snapshot's row runs before it is recorded, and the one a template build's
row runs with its reservation before it is inserted. Each runs in the transaction
that holds the team's lock and moves what it admits to a counted state (store/usage.py).
A quota crossed is a 429 `quota_exceeded` whose envelope names the limit, its value and the
current use; a shape outside the allowed size classes is a 422."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Row, bindparam, select
from sqlalchemy.orm import Session

from pandastack.wire.usage import QUOTA_LIMITS, QuotaInfo, QuotaUse

from ..settings import Settings
from ..store import Store
from ..store.events import note_quota_exceeded
from ..store.models import TeamQuota
from ..store.usage import (
    QuotaCheck,
    active_use,
    hibernated_use,
    segments_since,
    snapshot_use_gib,
    template_use_gib,
    volume_use_gib,
)
from ..web.errors import ApiError
from .metering import QuotaDefaults, Rates, format_size_classes, month_start, summarize

_TEAM_LIMITS = select(*[getattr(TeamQuota, name) for name in QUOTA_LIMITS]).where(
    TeamQuota.team == bindparam("quota_team"))

UNITS = {"max_sandboxes": "sandboxes", "max_vcpus": "vCPUs", "max_memory_mb": "MiB of memory",
         "max_volume_gb": "GiB of volumes", "monthly_budget_usd": "USD this month",
         "max_hibernated": "hibernated sandboxes", "max_snapshot_gb": "GiB of snapshots",
         "max_template_gb": "GiB of templates"}


def quota_exceeded(team: str, limit: str, value: float, current: float,
                   adding: float | None = None) -> ApiError:
    more = f" and this asks for {adding:g} more" if adding else ""
    note_quota_exceeded(team, limit=limit, value=value, current=current, adding=adding)
    return ApiError(429, "quota_exceeded",
                    f"team {team!r} is at its quota {limit}={value:g} {UNITS.get(limit, '')}: "
                    f"it holds {current:g}{more} (ask an admin to raise it, or end something)",
                    details={"limit": limit, "value": value, "current": current})


def limits_of(defaults: QuotaDefaults,
              row: TeamQuota | Row[Any] | None) -> dict[str, float | None]:
    """The limits in force: the team's own, else the server's default (None: unlimited)."""
    own = {name: None if row is None else getattr(row, name) for name in QUOTA_LIMITS}
    return {name: own[name] if own[name] is not None else getattr(defaults, name)
            for name in QUOTA_LIMITS}


def month_spend(s: Session, team: str, rates: Rates, now: float) -> float:
    start = month_start(now)
    _, totals = summarize(segments_since(s, team, start), start, now, now, "template", rates)
    return totals.cost_usd


def check_volume_quota(team: str, limit_gb: float | None, used_mb: float,
                       adding_mb: float) -> None:
    """429 if the team's volumes (`used_mb` now) cannot grow by `adding_mb` under
    `limit_gb` (None: unlimited). Pure: the caller reads the limit (`Quotas.volume_limit_gb`)
    and the use in its own transaction."""
    if limit_gb is None or adding_mb <= 0:
        return
    if (used_mb + adding_mb) / 1024 > limit_gb:
        raise quota_exceeded(team, "max_volume_gb", limit_gb, round(used_mb / 1024, 3),
                             round(adding_mb / 1024, 3))


class Quotas:
    """The server's quota checks, over its store and settings."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    def check_shape(self, vcpus: int | None, memory_mb: int | None) -> None:
        """422 unless (vcpus, memory_mb) is one of the allowed size classes (None: that
        part was not asked for)."""
        classes = self.settings.size_classes
        if vcpus is None and memory_mb is None:
            return
        if any((vcpus is None or vcpus == v) and (memory_mb is None or memory_mb == m)
               for v, m in classes):
            return
        raise ApiError(422, "validation_error",
                       f"vcpus={vcpus}, memory_mb={memory_mb} is not an allowed size class; "
                       f"allowed (VCPUSxMEMORY_MB): {format_size_classes(classes)}")

    def limits(self, s: Session, team: str) -> dict[str, float | None]:
        # A Core read of the limits (an ORM get cost twice as much on every create's check).
        own = s.connection().execute(_TEAM_LIMITS, {"quota_team": team}).first()
        return limits_of(self.settings.quota_defaults, own)

    def admission(self, shapes: Iterable[tuple[int, int]]) -> QuotaCheck:
        """The check of admitting sandboxes of these (vcpus, memory_mb) shapes, run in the
        transaction that holds the team's lock (`Store.admit`, `Store.check_quota`)."""
        shapes = list(shapes)
        count = len(shapes)
        vcpus = sum(v for v, _ in shapes)
        memory = sum(m for _, m in shapes)

        def check(s: Session, team: str) -> None:
            limits = self.limits(s, team)
            if any(limits[name] is not None
                   for name in ("max_sandboxes", "max_vcpus", "max_memory_mb")):
                held = dict(zip(("max_sandboxes", "max_vcpus", "max_memory_mb"),
                                active_use(s, team), strict=True))
                adding = {"max_sandboxes": count, "max_vcpus": vcpus, "max_memory_mb": memory}
                for name, current in held.items():
                    limit = limits[name]
                    if limit is not None and current + adding[name] > limit:
                        raise quota_exceeded(team, name, limit, current, adding[name])
            budget = limits["monthly_budget_usd"]
            if budget is not None:
                spent = month_spend(s, team, self.settings.rates, time.time())
                if spent >= budget:
                    raise quota_exceeded(team, "monthly_budget_usd", budget, round(spent, 6))
        return check

    def hibernation(self) -> QuotaCheck:
        """The check of one more hibernated sandbox (`Store.reserve` before a hibernate)."""
        def check(s: Session, team: str) -> None:
            limit = self.limits(s, team)["max_hibernated"]
            if limit is not None:
                current = hibernated_use(s, team)
                if current + 1 > limit:
                    raise quota_exceeded(team, "max_hibernated", limit, current, 1)
        return check

    def snapshot_room(self, adding_bytes: int) -> QuotaCheck:
        """The check of storing `adding_bytes` more of snapshots (0: whether any room is
        left, before a snapshot whose size is not known yet is taken)."""
        return self._stored_room("max_snapshot_gb", snapshot_use_gib, adding_bytes)

    def template_room(self, reserving_bytes: int) -> QuotaCheck:
        """The check of a build that reserves `reserving_bytes` (its row's `size_bytes`)
        before its size is known: the team's stored and reserved template bytes plus these
        must stay within max_template_gb. A build may end bigger than it reserved; it still
        lands (its template exists by then), and the next build finds the team over."""
        return self._stored_room("max_template_gb", template_use_gib, reserving_bytes)

    def _stored_room(self, limit_name: str, use_gib: Callable[[Session, str], float],
                     adding_bytes: int) -> QuotaCheck:
        """A check that the team's stored GiB (`use_gib`) plus `adding_bytes` stay within
        `limit_name` (0 bytes: whether any room is left)."""
        def check(s: Session, team: str) -> None:
            limit = self.limits(s, team)[limit_name]
            if limit is None:
                return
            current = use_gib(s, team)
            adding = adding_bytes / (1 << 30)
            if current + adding > limit or (adding_bytes == 0 and current >= limit):
                raise quota_exceeded(team, limit_name, limit, round(current, 6),
                                     round(adding, 6) or None)
        return check

    def volume_limit_gb(self, team: str) -> float | None:
        with self.store.session() as s:
            return self.limits(s, team)["max_volume_gb"]

    def check_volume(self, s: Session, team: str, adding_mb: float) -> None:
        """In the volume code's transaction: 429 if the team's volumes cannot grow by
        `adding_mb` (its use is the open volume segments)."""
        check_volume_quota(team, self.limits(s, team)["max_volume_gb"],
                           volume_use_gib(s, team) * 1024, adding_mb)

    def info(self, team: str) -> QuotaInfo:
        with self.store.session() as s:
            row = s.get(TeamQuota, team)
            limits = limits_of(self.settings.quota_defaults, row)
            sandboxes, vcpus, memory = active_use(s, team)
            use = QuotaUse(sandboxes=sandboxes, vcpus=vcpus, memory_mb=memory,
                           volume_gb=round(volume_use_gib(s, team), 6),
                           month_spend_usd=round(month_spend(s, team, self.settings.rates,
                                                             time.time()), 6),
                           hibernated=hibernated_use(s, team),
                           snapshot_gb=round(snapshot_use_gib(s, team), 6),
                           template_gb=round(template_use_gib(s, team), 6))
        defaults = [name for name in QUOTA_LIMITS
                    if row is None or getattr(row, name) is None]
        return QuotaInfo(team=team, defaults=defaults, usage=use,
                         **limits)  # type: ignore[arg-type]
