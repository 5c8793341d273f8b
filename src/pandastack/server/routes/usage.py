"""Usage and quotas: `GET /v1/usage` (what a team held and what it cost, by sandbox, day or
template; an admin's key sees every team) and a team's quota (`/v1/teams/{team}/quota`,
admin only)."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query

from pandastack.wire.usage import QuotaInfo, QuotaUpdate, UsageGroupBy, UsageReport

from ..accounts.auth import AdminPrincipal, CurrentPrincipal
from ..accounts.metering import month_start, summarize
from ..sandboxes.service import SandboxService
from ..store import Store
from ..web.errors import ApiError
from ..web.jsonbody import StrictJsonRoute
from .deps import Service
from .keys import TEAM_RE

router = APIRouter(tags=["usage"], route_class=StrictJsonRoute)

TeamName = Annotated[str, Path(max_length=128, description="a team's name")]
#: The widest window a report covers (its segments are summed in the request).
MAX_WINDOW_SECONDS = 400 * 86400


def parse_time(value: str | None, name: str) -> float | None:
    """UNIX seconds or ISO 8601 (a time without an offset is UTC); 422 otherwise."""
    if value is None or value.strip() == "":
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ApiError(422, "validation_error", f"{name}: {value!r} is neither UNIX "
                           "seconds nor an ISO 8601 time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp()
    if not math.isfinite(seconds) or not 0 <= seconds < 1e11:
        raise ApiError(422, "validation_error", f"{name}: {value!r} is out of range")
    return seconds


def _report(store: Store, service: SandboxService, team: str | None, start: float, end: float,
            group_by: str) -> UsageReport:
    now = time.time()
    rows, totals = summarize(store.usage_segments(team, start, end), start, end, now, group_by,
                             service.settings.rates)
    return UsageReport(start=start, end=end, group_by=group_by,  # type: ignore[arg-type]
                       team=team, rows=rows, totals=totals, rates=service.settings.rates.card())


@router.get("/usage", response_model=UsageReport, operation_id="getUsage",
            summary="What the team held in [start, end) and what it cost, grouped "
                    "(default: this month so far, by sandbox)")
async def get_usage(
        who: CurrentPrincipal, service: Service,
        start: Annotated[str | None, Query(max_length=64, description=(
            "UNIX seconds or ISO 8601 (default: the start of this month, UTC)"))] = None,
        end: Annotated[str | None, Query(max_length=64, description=(
            "UNIX seconds or ISO 8601 (default: now)"))] = None,
        group_by: UsageGroupBy = "sandbox",
        team: Annotated[str | None, Query(max_length=128, description=(
            "admin keys: one team (default: every team); others: their own only"))] = None,
) -> UsageReport:
    now = time.time()
    lo = parse_time(start, "start")
    hi = parse_time(end, "end")
    lo = month_start(now) if lo is None else lo
    hi = now if hi is None else hi
    if hi <= lo:
        raise ApiError(422, "validation_error", "end must be after start")
    if hi - lo > MAX_WINDOW_SECONDS:
        raise ApiError(422, "validation_error",
                       f"the window is wider than {MAX_WINDOW_SECONDS // 86400} days")
    if team is not None and not TEAM_RE.match(team):
        raise ApiError(422, "validation_error", "team: letters, digits, '.', '_' and '-' only")
    if not who.admin:
        if team is not None and team != who.team:
            raise ApiError(403, "forbidden", "only an admin key sees another team's usage")
        team = who.team
    return await asyncio.to_thread(_report, service.store, service, team, lo, hi, group_by)


def _team(team: str) -> str:
    if not TEAM_RE.match(team):
        raise ApiError(422, "validation_error", "team: letters, digits, '.', '_' and '-' only")
    return team


@router.get("/teams/{team}/quota", response_model=QuotaInfo, operation_id="getTeamQuota",
            summary="A team's limits in force and what it holds now (admin)")
async def get_team_quota(team: TeamName, who: AdminPrincipal, service: Service) -> QuotaInfo:
    return await asyncio.to_thread(service.quotas.info, _team(team))


@router.put("/teams/{team}/quota", response_model=QuotaInfo, operation_id="setTeamQuota",
            summary="Set a team's limits (admin): fields left out keep their value, a null "
                    "returns one to the server's default")
async def set_team_quota(team: TeamName, body: QuotaUpdate, who: AdminPrincipal,
                         service: Service) -> QuotaInfo:
    team = _team(team)
    values = {name: getattr(body, name) for name in body.model_fields_set}
    await asyncio.to_thread(service.store.set_quota, team, values)
    return await asyncio.to_thread(service.quotas.info, team)
