"""max_template_gb (issue 37 gap) at the HTTP layer over the in-memory host and a scripted
builder, on SQLite and PostgreSQL: a build reserves its estimate when it is admitted, so
racing builds never end over the quota; its row then holds what the host measured at its
end; a build that ends bigger than it reserved lands and the next one is refused; deleting
a version frees its bytes. Real builds: tests/e2e/test_templates.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pandastack.server.sandboxes.templates import BUILD_RESERVE_BYTES
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime, ScriptedBuilder

GIB = 1 << 30
SPEC = {"from_template": "base", "steps": [{"kind": "run", "command": "echo hi"}]}
#: What the fake host's snapshot of a finished build stores (tests/server/fakes.py).
FAKE_SNAPSHOT_BYTES = 4096


@pytest.fixture
async def env(tmp_path: Path, db: str) -> AsyncIterator[tuple[Api, ScriptedBuilder]]:
    runtime = FakeRuntime(tmp_path)
    builder = ScriptedBuilder(runtime, gated=True)
    settings = make_settings(tmp_path, db_url=db, reaper_interval_seconds=3600)
    async with running_app(settings, runtime, builder=builder) as api:
        yield api, builder


async def team(api: Api, name: str, max_template_gb: float) -> dict[str, str]:
    r = await api.client.put(f"/v1/teams/{name}/quota",
                             json={"max_template_gb": max_template_gb})
    assert r.status_code == 200, r.text
    assert r.json()["max_template_gb"] == max_template_gb
    return api.headers(await api.new_key(name))


def build(api: Api, h: dict[str, str], name: str) -> Any:
    return api.client.post("/v1/templates", json={"name": name, "spec": SPEC}, headers=h)


async def template_bytes(api: Api, name: str) -> Any:
    """The team's template bytes as the quota API shows them (GiB to 6 decimals: ~1 KiB)."""
    r = await api.client.get(f"/v1/teams/{name}/quota")
    return pytest.approx(r.json()["usage"]["template_gb"] * GIB, abs=GIB * 1e-6)


async def ended(api: Api, h: dict[str, str], build_id: str) -> str:
    for _ in range(500):
        r = await api.client.get(f"/v1/templates/builds/{build_id}", headers=h)
        status = str(r.json()["status"])
        if status != "building":
            return status
        await asyncio.sleep(0.01)
    raise AssertionError(f"build {build_id} never ended")


def refused(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert (error["code"], error["limit"]) == ("quota_exceeded", "max_template_gb"), r.text
    assert "max_template_gb" in error["message"] and "GiB of templates" in error["message"]


async def test_four_racing_builds_under_room_for_two(
        env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    # Room for two reservations; the builds wait in the builder, so none has a size yet:
    # a check that counted only finished versions would let all four through.
    h = await team(api, "b", (2 * BUILD_RESERVE_BYTES + (1 << 20)) / GIB)
    answers = await asyncio.gather(*(build(api, h, f"t{i}") for i in range(4)))
    assert sorted(r.status_code for r in answers) == [202, 202, 429, 429], answers
    for r in answers:
        if r.status_code == 429:
            refused(r)
    assert await template_bytes(api, "b") == 2 * BUILD_RESERVE_BYTES
    builder.release.set()
    for r in answers:
        if r.status_code == 202:
            assert await ended(api, h, r.json()["build_id"]) == "ready"
    # Settled with what the host reported: the reservations are given back.
    assert await template_bytes(api, "b") == 2 * FAKE_SNAPSHOT_BYTES
    r = await build(api, h, "t9")
    assert r.status_code == 202, r.text
    assert await ended(api, h, r.json()["build_id"]) == "ready"
    # Another team's quota and templates are its own.
    other = await team(api, "c", 0.0)
    refused(await build(api, other, "t0"))


async def test_bigger_than_reserved_lands_then_refuses_until_deleted(
        env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    builder.release.set()
    limit = 3 * BUILD_RESERVE_BYTES
    h = await team(api, "d", limit / GIB)
    builder.extra_bytes = limit  # the template ends bigger than the whole quota
    r = await build(api, h, "big")
    assert r.status_code == 202, r.text
    assert await ended(api, h, r.json()["build_id"]) == "ready"
    assert await template_bytes(api, "d") == limit + FAKE_SNAPSHOT_BYTES
    builder.extra_bytes = 0
    refused(await build(api, h, "small"))
    assert (await api.client.delete("/v1/templates/big?version=1", headers=h)).status_code == 204
    assert await template_bytes(api, "d") == 0
    r = await build(api, h, "small")
    assert r.status_code == 202, r.text
    assert await ended(api, h, r.json()["build_id"]) == "ready"


async def test_a_failed_build_gives_its_reservation_back(
        env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    builder.release.set()
    h = await team(api, "f", (BUILD_RESERVE_BYTES + (1 << 20)) / GIB)
    spec = {"from_template": "base", "steps": [{"kind": "run", "command": "fail"}]}
    r = await api.client.post("/v1/templates", json={"name": "bad", "spec": spec}, headers=h)
    assert r.status_code == 202, r.text
    assert await ended(api, h, r.json()["build_id"]) == "failed"
    assert await template_bytes(api, "f") == 0
    r = await build(api, h, "good")
    assert r.status_code == 202, r.text
    assert await ended(api, h, r.json()["build_id"]) == "ready"
