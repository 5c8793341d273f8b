"""Call builders of usage reports and team quotas (`Client.usage`, `client.teams`), and the
namespaces `client.teams` of both twins."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pandastack.sdk import _base
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk.errors import InvalidRequestError
from pandastack.wire.usage import QUOTA_LIMITS, USAGE_GROUPS, QuotaInfo, QuotaUpdate, UsageReport

__all__ = ["AsyncTeams", "Teams", "TimeArg"]

#: A time of a usage window: UNIX seconds, a datetime (naive: UTC), or ISO 8601 text.
TimeArg = float | int | datetime | str


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, status=422, code="validation_error")


def _time(value: TimeArg | None, name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bool):
        raise _invalid(f"{name}: a time, not a bool")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise _invalid(f"{name}: {value!r} is not a time")
        return repr(float(value))
    return str(value)


def usage_call(start: TimeArg | None, end: TimeArg | None, group_by: str,
               team: str | None) -> _base.Call[UsageReport]:
    if group_by not in USAGE_GROUPS:
        raise _invalid(f"group_by: one of {', '.join(USAGE_GROUPS)}")
    params = {k: v for k, v in (("start", _time(start, "start")), ("end", _time(end, "end")),
                                ("group_by", group_by), ("team", team)) if v is not None}
    return _base.Call("GET", "/v1/usage", _base.model_decoder(UsageReport), params=params)


def _quota_path(team: str) -> str:
    return f"/v1/teams/{_base.path_segment(team)}/quota"


def get_quota_call(team: str) -> _base.Call[QuotaInfo]:
    return _base.Call("GET", _quota_path(team), _base.model_decoder(QuotaInfo))


def set_quota_call(team: str, limits: dict[str, Any],
                   clear: tuple[str, ...] | list[str]) -> _base.Call[QuotaInfo]:
    unknown = sorted(set(clear) - set(QUOTA_LIMITS))
    if unknown:
        raise _invalid(f"clear: unknown limits {unknown} (limits: {', '.join(QUOTA_LIMITS)})")
    body = _base.encode(QuotaUpdate, **limits)
    body.update({name: None for name in clear})
    return _base.Call("PUT", _quota_path(team), _base.model_decoder(QuotaInfo), json=body)


class Teams(_base.ClientBase[HTTP]):
    """`client.teams`: teams' quotas (needs an admin key)."""

    def get_quota(self, team: str) -> QuotaInfo:
        """The limits in force for `team` (None: unlimited) and what it holds now."""
        return self._http.run(get_quota_call(team))

    def set_quota(self, team: str, *, max_sandboxes: int | None = None,
                  max_vcpus: int | None = None, max_memory_mb: int | None = None,
                  max_volume_gb: float | None = None,
                  monthly_budget_usd: float | None = None,
                  max_hibernated: int | None = None,
                  max_snapshot_gb: float | None = None,
                  max_template_gb: float | None = None,
                  clear: tuple[str, ...] | list[str] = ()) -> QuotaInfo:
        """Set the given limits of `team` (the others keep their value); the limits named
        in `clear` go back to the server's default."""
        return self._http.run(set_quota_call(team, {
            "max_sandboxes": max_sandboxes, "max_vcpus": max_vcpus,
            "max_memory_mb": max_memory_mb, "max_volume_gb": max_volume_gb,
            "monthly_budget_usd": monthly_budget_usd, "max_hibernated": max_hibernated,
            "max_snapshot_gb": max_snapshot_gb, "max_template_gb": max_template_gb}, clear))


class AsyncTeams(_base.ClientBase[AsyncHTTP]):
    """`client.teams`: teams' quotas (async; needs an admin key)."""

    async def get_quota(self, team: str) -> QuotaInfo:
        """The limits in force for `team` (None: unlimited) and what it holds now."""
        return await self._http.run(get_quota_call(team))

    async def set_quota(self, team: str, *, max_sandboxes: int | None = None,
                        max_vcpus: int | None = None, max_memory_mb: int | None = None,
                        max_volume_gb: float | None = None,
                        monthly_budget_usd: float | None = None,
                        max_hibernated: int | None = None,
                        max_snapshot_gb: float | None = None,
                        max_template_gb: float | None = None,
                        clear: tuple[str, ...] | list[str] = ()) -> QuotaInfo:
        """Set the given limits of `team` (the others keep their value); the limits named
        in `clear` go back to the server's default."""
        return await self._http.run(set_quota_call(team, {
            "max_sandboxes": max_sandboxes, "max_vcpus": max_vcpus,
            "max_memory_mb": max_memory_mb, "max_volume_gb": max_volume_gb,
            "monthly_budget_usd": monthly_budget_usd, "max_hibernated": max_hibernated,
            "max_snapshot_gb": max_snapshot_gb, "max_template_gb": max_template_gb}, clear))
