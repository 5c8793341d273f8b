"""Team templates at the HTTP layer over the in-memory runtime and a scripted builder:
versions, the building state (409 template_building, never a hang), log following, failure,
delete, team isolation, shape defaults. Real builds in microVMs: tests/host/test_builds.py and
tests/e2e/test_templates.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, ScriptedBuilder


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Api, ScriptedBuilder]]:
    runtime = FakeRuntime(tmp_path)
    builder = ScriptedBuilder(runtime, gated=True)
    async with running_app(make_settings(tmp_path), runtime, builder=builder) as api:
        yield api, builder


SPEC = {"from_template": "base", "steps": [{"kind": "run", "command": "echo hi"}]}


async def wait_status(api: Api, build_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = await api.client.get(f"/v1/templates/builds/{build_id}")
        assert r.status_code == 200, r.text
        if r.json()["status"] == status:
            data: dict[str, Any] = r.json()
            return data
        await asyncio.sleep(0.01)
    raise AssertionError(f"build {build_id} never became {status}")


async def test_build_version_create_and_delete(env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    r = await api.client.post("/v1/templates", json={"name": "app", "spec": SPEC,
                                                      "memory_mb": 1024})
    assert r.status_code == 202, r.text
    build = r.json()
    assert build["status"] == "building" and build["version"] == 1
    # While it builds, a create answers at once: 409 template_building with Retry-After.
    r = await api.client.post("/v1/sandboxes", json={"template": "app"})
    assert_envelope(r, 409, "template_building")
    assert r.headers["retry-after"]
    builder.release.set()
    await wait_status(api, build["build_id"], "ready")
    assert builder.shapes == [(1, 1024)]
    assert builder.scopes == ["default"]  # the step cache is the building team's

    r = await api.client.post("/v1/sandboxes", json={"template": "app"})
    assert r.status_code == 201, r.text
    sbx = r.json()
    assert sbx["template"] == "app:1" and sbx["memory_mb"] == 1024
    r = await api.client.post(f"/v1/sandboxes/{sbx['id']}/exec", json={"cmd": "true"})
    assert r.status_code == 200
    # The shape is the template's: asking for another is refused, not silently changed.
    r = await api.client.post("/v1/sandboxes", json={"template": "app", "memory_mb": 512})
    assert_envelope(r, 422, "validation_error")

    r = await api.client.post("/v1/templates", json={"name": "app", "spec": SPEC})
    second = r.json()
    assert second["version"] == 2
    await wait_status(api, second["build_id"], "ready")
    r = await api.client.get("/v1/templates/app")
    assert [v["version"] for v in r.json()["versions"]] == [1, 2]
    r = await api.client.get("/v1/templates")
    assert [(t["name"], t["version"]) for t in r.json()["templates"]] == [("app", 2)]

    assert (await api.client.delete("/v1/templates/app?version=1")).status_code == 204
    assert_envelope(await api.client.post("/v1/sandboxes", json={"template": "app:1"}),
                    404, "not_found")
    r = await api.client.post("/v1/sandboxes", json={"template": "app"})
    assert r.status_code == 201 and r.json()["template"] == "app:2"
    assert (await api.client.delete("/v1/templates/app")).status_code == 204
    assert_envelope(await api.client.get("/v1/templates/app"), 404, "not_found")


async def test_logs_follow_and_failure(env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    spec = {"steps": [{"kind": "run", "command": "fail"}]}
    build = (await api.client.post("/v1/templates", json={"name": "bad", "spec": spec})).json()

    async def follow() -> str:
        async with api.client.stream("GET", f"/v1/templates/builds/{build['build_id']}/logs") \
                as response:
            assert response.status_code == 200
            return "".join([chunk async for chunk in response.aiter_text()])

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    assert not follower.done()  # it waits for the build
    builder.release.set()
    text = await asyncio.wait_for(follower, 10)
    assert "Step 1/1 RUN something" in text and "boom" in text
    final = json.loads(text.rsplit("event: status\ndata: ", 1)[1])
    assert final["status"] == "failed" and "step 1/1" in final["error"]
    r = await api.client.post("/v1/sandboxes", json={"template": "bad"})
    assert_envelope(r, 409, "conflict")
    assert "failed to build" in r.json()["error"]["message"]
    # After the build, the stored log is replayed.
    assert "boom" in await follow()


async def test_names_isolation_and_bad_input(env: tuple[Api, ScriptedBuilder]) -> None:
    api, builder = env
    builder.release.set()
    for body in ({"name": "base", "spec": SPEC},           # a built-in name
                 {"name": "Bad Name", "spec": SPEC},
                 {"name": "x", "spec": {"steps": [{"kind": "nope"}]}},
                 {"name": "x", "spec": SPEC, "extra": 1}):
        assert_envelope(await api.client.post("/v1/templates", json=body), 422,
                        "validation_error")
    build = (await api.client.post("/v1/templates", json={"name": "mine", "spec": SPEC})).json()
    await wait_status(api, build["build_id"], "ready")
    other = await api.new_key("other-team")
    headers = api.headers(other)
    assert_envelope(await api.client.get("/v1/templates/mine", headers=headers), 404,
                    "not_found")
    assert_envelope(await api.client.get(f"/v1/templates/builds/{build['build_id']}",
                                         headers=headers), 404, "not_found")
    r = await api.client.post("/v1/sandboxes", json={"template": "mine"}, headers=headers)
    assert_envelope(r, 404, "not_found")
    assert_envelope(await api.client.get("/v1/templates/builds/nope"), 404, "not_found")


async def test_builtin_first_use_answers_building_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A built-in template that is not built yet: the create answers 409 template_building
    (with Retry-After) instead of holding the request for the whole build, and succeeds once
    the build is done."""
    monkeypatch.setattr("pandastack.server.sandboxes.service.PREPARE_WAIT_SECONDS", 0.05)
    runtime = FakeRuntime(tmp_path)
    runtime.template_built = asyncio.Event()
    async with running_app(make_settings(tmp_path), runtime) as api:
        r = await api.client.post("/v1/sandboxes", json={})
        assert_envelope(r, 409, "template_building")
        assert int(r.headers["retry-after"]) > 0
        assert runtime.sandboxes == {}  # no row, no VM while it builds
        runtime.template_built.set()
        r = await api.client.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text


async def test_builds_beyond_the_limit_wait_their_turn(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    builder = ScriptedBuilder(runtime, gated=True)
    settings = make_settings(tmp_path, max_concurrent_builds=1, max_builds_per_team=2)
    async with running_app(settings, runtime, builder=builder) as api:
        first = (await api.client.post("/v1/templates", json={"name": "a", "spec": SPEC})).json()
        second = (await api.client.post("/v1/templates", json={"name": "b", "spec": SPEC})).json()
        await asyncio.sleep(0.05)
        assert len(builder.shapes) == 1  # only one build runs
        builder.release.set()
        for build in (first, second):
            await wait_status(api, build["build_id"], "ready")
        async with api.client.stream("GET", f"/v1/templates/builds/{second['build_id']}/logs") \
                as response:
            text = "".join([chunk async for chunk in response.aiter_text()])
        assert "waiting for a build slot" in text


async def test_the_list_has_the_builtin_templates_beside_the_teams(
        env: tuple[Api, ScriptedBuilder]) -> None:
    """GET /v1/templates names the built-ins too (a fresh install's list was empty), the
    default marked, in `builtin`: `templates` stays the team's builds."""
    api, builder = env
    want = [{"name": "base", "default": True}, {"name": "code-interpreter", "default": False},
            {"name": "full", "default": False}, {"name": "node", "default": False},
            {"name": "python", "default": False}]
    r = await api.client.get("/v1/templates")
    assert r.status_code == 200, r.text
    assert r.json() == {"templates": [], "builtin": want}
    build = (await api.client.post("/v1/templates", json={"name": "app", "spec": SPEC})).json()
    builder.release.set()
    await wait_status(api, build["build_id"], "ready")
    other = await api.new_key("team-other")
    for headers, names in ((None, ["app"]), (api.headers(other), [])):
        listed = (await api.client.get("/v1/templates", headers=headers)).json()
        assert [t["name"] for t in listed["templates"]] == names
        assert listed["builtin"] == want
