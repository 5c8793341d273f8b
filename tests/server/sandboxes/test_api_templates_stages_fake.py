"""Multi-stage template builds at the HTTP layer (issue 37 part 3): every stage's base is
resolved through the building team as the last stage's is (a team template becomes its
snapshot, another team's is a 404, an image passes as written), and the stage count is
bounded with a 422. The stages' VMs: tests/e2e/test_templates_stages.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.rules import MAX_TEMPLATE_STAGES
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, ScriptedBuilder


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Api, ScriptedBuilder]]:
    runtime = FakeRuntime(tmp_path)
    builder = ScriptedBuilder(runtime)
    async with running_app(make_settings(tmp_path), runtime, builder=builder) as api:
        yield api, builder


def two_stage(first: str, last: str = "base") -> dict[str, Any]:
    return {"from_template": last,
            "stages": [{"name": "build", "from_template": first,
                        "steps": [{"kind": "run", "command": "make"}]}],
            "steps": [{"kind": "copy_from", "stage": 0, "sources": ["/out"], "dst": "/opt/"}]}


async def ready(api: Api, body: dict[str, Any], headers: dict[str, str] | None = None
                ) -> dict[str, Any]:
    r = await api.client.post("/v1/templates", json=body, headers=headers)
    assert r.status_code == 202, r.text
    build: dict[str, Any] = r.json()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = await api.client.get(f"/v1/templates/builds/{build['build_id']}", headers=headers)
        if r.json()["status"] == "ready":
            return build
        assert r.json()["status"] == "building", r.text
        await asyncio.sleep(0.01)
    raise AssertionError("the build never became ready")


async def test_each_stage_base_is_resolved_through_the_team(
        env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    await ready(api, {"name": "tools", "spec": {"from_template": "base"}})
    await ready(api, {"name": "app", "spec": two_stage("tools", "python:3.12-slim")})
    spec = builder.specs[-1]
    assert spec.from_template == "python:3.12-slim"  # an image: the host pulls it
    # The team's template, as the host knows it: its version's snapshot.
    assert spec.stages[0].from_template.startswith("snapshot:")
    assert "tools" not in spec.stages[0].from_template
    assert spec.steps[0].kind == "copy_from"

    other = api.headers(await api.new_key("other-team"))
    r = await api.client.post("/v1/templates", json={"name": "x", "spec": two_stage("tools")},
                              headers=other)
    assert_envelope(r, 404, "not_found")
    assert "tools" in r.json()["error"]["message"]


async def test_stage_count_and_references_are_checked(env: tuple[Api, ScriptedBuilder]) -> None:
    api, _ = env
    spec = two_stage("base")
    spec["stages"] = spec["stages"] * MAX_TEMPLATE_STAGES
    assert_envelope(await api.client.post("/v1/templates", json={"name": "x", "spec": spec}),
                    422, "validation_error")
    spec = two_stage("base")
    spec["steps"][0]["stage"] = 1  # no such earlier stage
    r = await api.client.post("/v1/templates", json={"name": "x", "spec": spec})
    assert_envelope(r, 422, "validation_error")
    assert "earlier" in r.text
