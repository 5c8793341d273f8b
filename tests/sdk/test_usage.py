"""`Client.usage`, `client.teams` and `QuotaExceededError` over a mock transport, both twins:
the requests they send and what they make of the answers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from pandastack.sdk import (
    AsyncClient,
    Client,
    InvalidRequestError,
    QuotaExceededError,
    RateLimitError,
    UsageReport,
)

QUANTITIES = {"vcpu_seconds": 20.0, "memory_gib_seconds": 10.0, "disk_gib_seconds": 20.0,
              "volume_gib_seconds": 0.0, "snapshot_gib_seconds": 0.0, "cost_usd": 0.000345}
REPORT = {"start": 1.0, "end": 2.0, "group_by": "day", "team": "t",
          "rows": [{"team": "t", "day": "2026-01-01", **QUANTITIES}], "totals": QUANTITIES,
          "rates": {"vcpu_second": 0.000015, "memory_gib_second": 0.0000045,
                    "disk_gib_second": 4e-8, "volume_gib_second": 4e-8,
                    "snapshot_gib_second": 2e-8}}
QUOTA = {"team": "t", "max_sandboxes": 2, "defaults": ["max_vcpus"],
         "usage": {"sandboxes": 1, "vcpus": 1, "memory_mb": 512, "volume_gb": 0.0,
                   "month_spend_usd": 0.1}}
QUOTA_ERROR = {"error": {"code": "quota_exceeded", "message": "at quota",
                         "request_id": "req_1", "limit": "max_sandboxes", "value": 2,
                         "current": 2}}


def handler(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/usage":
            return httpx.Response(200, json=REPORT)
        if request.url.path == "/v1/sandboxes":
            return httpx.Response(429, json=QUOTA_ERROR)
        return httpx.Response(200, json=QUOTA)
    return httpx.MockTransport(handle)


def test_sync_usage_teams_and_quota_error() -> None:
    seen: list[httpx.Request] = []
    with Client("http://x", "psk_test", transport=handler(seen)) as c:
        report = c.usage(start=datetime(2026, 1, 1, tzinfo=UTC), end=1767312000,
                         group_by="day", team="t")
        assert isinstance(report, UsageReport) and report.rows[0].day == "2026-01-01"
        assert dict(seen[-1].url.params) == {"start": "2026-01-01T00:00:00+00:00",
                                             "end": "1767312000.0", "group_by": "day",
                                             "team": "t"}
        assert c.usage().totals.vcpu_seconds == 20.0
        assert dict(seen[-1].url.params) == {"group_by": "sandbox"}
        info = c.teams.set_quota("t", max_sandboxes=2, clear=["max_vcpus"])
        assert info.max_sandboxes == 2 and info.usage.memory_mb == 512
        assert seen[-1].method == "PUT" and seen[-1].url.path == "/v1/teams/t/quota"
        assert json.loads(seen[-1].content) == {"max_sandboxes": 2, "max_vcpus": None}
        assert c.teams.get_quota("t").defaults == ["max_vcpus"]
        c.teams.set_quota("t", max_hibernated=4, max_snapshot_gb=2.5,
                          clear=["max_snapshot_gb"])
        assert json.loads(seen[-1].content) == {"max_hibernated": 4, "max_snapshot_gb": None}
        c.teams.set_quota("t", max_template_gb=0.5)
        assert json.loads(seen[-1].content) == {"max_template_gb": 0.5}
        with pytest.raises(QuotaExceededError) as exc:
            c.sandboxes.create()
        err = exc.value
        assert isinstance(err, RateLimitError)  # an `except RateLimitError` still catches it
        assert (err.status, err.code, err.limit, err.value, err.current, err.request_id) == (
            429, "quota_exceeded", "max_sandboxes", 2, 2, "req_1")
        sent = len(seen)
        for bad in ({"group_by": "week"}, {"start": float("nan")}):
            with pytest.raises(InvalidRequestError):
                c.usage(**bad)
        with pytest.raises(InvalidRequestError):
            c.teams.set_quota("t", clear=["max_cats"])
        with pytest.raises(InvalidRequestError):
            c.teams.set_quota("t", max_sandboxes=-1)
        assert len(seen) == sent  # refused before sending


async def test_async_twin() -> None:
    seen: list[httpx.Request] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        return handler(seen).handle_request(request)

    async with AsyncClient("http://x", "psk_test",
                           transport=httpx.MockTransport(handle)) as c:
        report = await c.usage(group_by="day")
        assert report.totals.memory_gib_seconds == 10.0
        info: Any = await c.teams.set_quota("t", monthly_budget_usd=50)
        assert info.team == "t"
        assert json.loads(seen[-1].content) == {"monthly_budget_usd": 50.0}
        assert (await c.teams.get_quota("t")).max_sandboxes == 2
        with pytest.raises(QuotaExceededError) as exc:
            await c.sandboxes.create()
        assert exc.value.limit == "max_sandboxes"
