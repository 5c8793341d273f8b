"""Quotas and usage through the HTTP layer over the in-memory runtime, on SQLite and
PostgreSQL: a team at max_sandboxes 2 gets 429 quota_exceeded (limit, value, current in the
envelope) on the third create and on a fork or wake that would pass it, nothing is left
half-made, and after a kill the next create succeeds; shapes outside the size classes are
422; /v1/usage answers by sandbox, day and template, refuses bad input with 422 and other
teams' usage to non-admin keys; quotas are admin-only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
async def api(tmp_path: Path, db: str) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path, db_url=db), FakeRuntime(tmp_path)) as a:
        yield a


def assert_quota(r: httpx.Response, limit: str, value: float, current: float) -> None:
    assert r.status_code == 429, r.text
    body = r.json()["error"]
    assert body["code"] == "quota_exceeded", body
    assert (body["limit"], body["value"], body["current"]) == (limit, value, current), body
    assert body["request_id"] == r.headers["x-request-id"]


async def test_max_sandboxes_on_create_fork_and_wake(api: Api) -> None:
    c = api.client
    key = await api.new_key("small")
    small = api.headers(key)
    r = await c.put("/v1/teams/small/quota", json={"max_sandboxes": 2})
    assert r.status_code == 200, r.text
    assert r.json()["max_sandboxes"] == 2 and "max_sandboxes" not in r.json()["defaults"]
    ids = []
    for _ in range(2):
        r = await c.post("/v1/sandboxes", json={"persistent": True}, headers=small)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    r = await c.post("/v1/sandboxes", json={}, headers=small)
    assert_quota(r, "max_sandboxes", 2, 2)
    r = await c.post(f"/v1/sandboxes/{ids[0]}/fork", json={"count": 1}, headers=small)
    assert_quota(r, "max_sandboxes", 2, 2)
    listed = (await c.get("/v1/sandboxes", params={"include_ended": "true"},
                          headers=small)).json()["sandboxes"]
    assert sorted(s["id"] for s in listed) == sorted(ids)  # nothing half-made
    # a hibernated sandbox does not count, and waking it counts again
    r = await c.post(f"/v1/sandboxes/{ids[1]}/hibernate", headers=small)
    assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
    r = await c.post("/v1/sandboxes", json={}, headers=small)
    assert r.status_code == 201, r.text
    third = r.json()["id"]
    assert_quota(await c.post(f"/v1/sandboxes/{ids[1]}/wake", headers=small),
                 "max_sandboxes", 2, 2)
    assert_quota(await c.post(f"/v1/sandboxes/{ids[1]}/exec", json={"cmd": "true"},
                              headers=small), "max_sandboxes", 2, 2)  # the transparent wake
    assert (await c.get(f"/v1/sandboxes/{ids[1]}", headers=small)).json()["state"] == \
        "hibernated"
    assert (await c.delete(f"/v1/sandboxes/{third}", headers=small)).status_code == 204
    r = await c.post("/v1/sandboxes", json={}, headers=small)  # after a kill: room again
    assert r.status_code == 201, r.text
    info = (await c.get("/v1/teams/small/quota")).json()
    assert info["usage"]["sandboxes"] == 2 and info["usage"]["vcpus"] == 2
    # another team is not limited by it
    other = api.headers(await api.new_key("big"))
    for _ in range(3):
        assert (await c.post("/v1/sandboxes", json={}, headers=other)).status_code == 201


async def test_vcpu_memory_and_budget_quotas(api: Api) -> None:
    c = api.client
    r = await c.put("/v1/teams/t2/quota", json={"max_vcpus": 3, "max_memory_mb": 4096})
    assert r.status_code == 200, r.text
    h = api.headers(await api.new_key("t2"))
    assert (await c.post("/v1/sandboxes", json={"vcpus": 2, "memory_mb": 1024},
                         headers=h)).status_code == 201
    assert_quota(await c.post("/v1/sandboxes", json={"vcpus": 2, "memory_mb": 1024},
                              headers=h), "max_vcpus", 3, 2)
    r = await c.put("/v1/teams/t2/quota", json={"max_vcpus": None, "max_memory_mb": 1500})
    assert r.json()["max_vcpus"] is None and "max_vcpus" in r.json()["defaults"]
    assert_quota(await c.post("/v1/sandboxes", json={}, headers=h), "max_memory_mb", 1500,
                 1024)
    r = await c.put("/v1/teams/t2/quota", json={"max_memory_mb": None,
                                                "monthly_budget_usd": 0})
    assert r.status_code == 200, r.text
    r = await c.post("/v1/sandboxes", json={}, headers=h)
    assert r.status_code == 429 and r.json()["error"]["limit"] == "monthly_budget_usd"


async def test_size_classes(tmp_path: Path, db: str) -> None:
    settings = make_settings(tmp_path, db_url=db, size_classes=((1, 512), (2, 1024)))
    async with running_app(settings, FakeRuntime(tmp_path)) as api:
        c = api.client
        assert (await c.post("/v1/sandboxes", json={"vcpus": 2, "memory_mb": 1024})
                ).status_code == 201
        r = await c.post("/v1/sandboxes", json={"vcpus": 2, "memory_mb": 2048})
        assert_envelope(r, 422, "validation_error")
        assert "1x512, 2x1024" in r.json()["error"]["message"]
        r = await c.post("/v1/templates", json={
            "name": "big", "vcpus": 4, "memory_mb": 4096, "spec": {"from_template": "base"}})
        assert_envelope(r, 422, "validation_error")
        assert "2x1024" in r.json()["error"]["message"]


async def test_usage_report_and_its_access(api: Api) -> None:
    c = api.client
    key_a = await api.new_key("ua")
    a = api.headers(key_a)
    r = await c.post("/v1/sandboxes", json={"vcpus": 2, "memory_mb": 1024}, headers=a)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for group_by in ("sandbox", "day", "template"):
        r = await c.get("/v1/usage", params={"group_by": group_by}, headers=a)
        assert r.status_code == 200, r.text
        report = r.json()
        assert report["team"] == "ua" and report["group_by"] == group_by
        assert report["rates"]["vcpu_second"] == 0.000015
        assert report["rates"]["memory_gib_second"] == 0.0000045
        [row] = report["rows"]
        assert row["team"] == "ua"
        assert row[{"sandbox": "sandbox_id", "day": "day", "template": "template"}[group_by]]
        assert row["vcpu_seconds"] > 0 and row["disk_gib_seconds"] > 0
    r = await c.get("/v1/usage", params={"group_by": "sandbox"}, headers=a)
    assert r.json()["rows"][0]["sandbox_id"] == sid
    # an admin sees every team, or one; a team key sees only its own
    everyone = (await c.get("/v1/usage")).json()
    assert everyone["team"] is None and {row["team"] for row in everyone["rows"]} >= {"ua"}
    assert (await c.get("/v1/usage", params={"team": "ua"})).json()["team"] == "ua"
    other = api.headers(await api.new_key("ub"))
    assert (await c.get("/v1/usage", headers=other)).json()["rows"] == []
    assert_envelope(await c.get("/v1/usage", params={"team": "ua"}, headers=other), 403,
                    "forbidden")
    assert (await c.get("/v1/usage", params={"team": "ub"}, headers=other)).status_code == 200
    # quotas are for admins
    assert_envelope(await c.get("/v1/teams/ub/quota", headers=other), 403, "forbidden")
    assert_envelope(await c.put("/v1/teams/ub/quota", json={"max_sandboxes": 100},
                                headers=other), 403, "forbidden")
    assert_envelope(await c.put("/v1/teams/ub/quota", json={"max_sandboxes": -1}), 422,
                    "validation_error")
    assert_envelope(await c.put("/v1/teams/ub/quota", json={"nope": 1}), 422,
                    "validation_error")
    assert_envelope(await c.get("/v1/teams/bad%20team/quota"), 422, "validation_error")


@pytest.mark.parametrize("params", [
    {"start": "yesterday"}, {"end": "2026-13-01"}, {"start": "nan"}, {"start": "1e300"},
    {"start": "-5"}, {"start": "2000", "end": "1000"}, {"start": "0", "end": "1e10"},
    {"group_by": "week"}, {"team": "a b"}, {"start": "x" * 100},
])
async def test_bad_usage_params_are_422(api: Api, params: dict[str, str]) -> None:
    assert_envelope(await api.client.get("/v1/usage", params=params), 422, "validation_error")


async def test_usage_times_as_iso_or_unix(api: Api) -> None:
    c = api.client
    r = await c.get("/v1/usage", params={"start": "2026-01-01T00:00:00Z",
                                         "end": "2026-01-02"})
    assert r.status_code == 200, r.text
    assert (r.json()["start"], r.json()["end"]) == (1767225600.0, 1767312000.0)
    r = await c.get("/v1/usage", params={"start": "1767225600", "end": "1767312000.5"})
    assert (r.json()["start"], r.json()["end"]) == (1767225600.0, 1767312000.5)
