"""What one team may hold at once on a server (server/accounts/team_slots.py, issue 22): commands
running, streams and terminals open, build slots. Over the in-memory host, with commands and
watches that block until the test lets them go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pandastack.hostport.watch import WatchEvent
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, FakeSandbox, ScriptedBuilder


class Gate:
    """Blocks the fake guest's `hold` commands and its watches until `open` is set."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.entered = 0

    async def enter(self) -> None:
        self.entered += 1
        await self.open.wait()

    async def until(self, count: int) -> None:
        for _ in range(500):
            if self.entered >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} calls never reached the guest ({self.entered} did)")


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    real_exec = FakeSandbox.exec

    async def exec(self: FakeSandbox, cmd: str | Sequence[str], **kwargs: Any) -> Any:
        if cmd == "hold":
            await gate.enter()
        return await real_exec(self, cmd, **kwargs)

    async def watch(self: FakeSandbox, path: str, *,
                    recursive: bool = True) -> AsyncIterator[list[WatchEvent]]:
        yield [WatchEvent("watching", path)]
        await gate.enter()

    monkeypatch.setattr(FakeSandbox, "exec", exec)
    monkeypatch.setattr(FakeSandbox, "watch", watch)
    return gate


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    settings = make_settings(tmp_path, max_execs_per_team=2, max_streams_per_team=1)
    async with running_app(settings, FakeRuntime(tmp_path)) as api:
        yield api


async def team_sandbox(api: Api, team: str) -> tuple[dict[str, str], str]:
    headers = api.headers(await api.new_key(team))
    r = await api.client.post("/v1/sandboxes", json={}, headers=headers)
    assert r.status_code == 201, r.text
    return headers, r.json()["id"]


async def test_a_team_past_its_running_commands_gets_429_and_others_do_not(
        api: Api, gate: Gate) -> None:
    a, sid_a = await team_sandbox(api, "a")
    b, sid_b = await team_sandbox(api, "b")
    held = [asyncio.create_task(api.client.post(f"/v1/sandboxes/{sid_a}/exec",
                                                json={"cmd": "hold"}, headers=a))
            for _ in range(2)]
    await gate.until(2)
    r = await api.client.post(f"/v1/sandboxes/{sid_a}/exec", json={"cmd": "true"}, headers=a)
    assert_envelope(r, 429, "rate_limited")
    assert "2 commands running" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "1"
    r = await api.client.post(f"/v1/sandboxes/{sid_a}/exec/stream", json={"cmd": "true"},
                              headers=a)
    assert_envelope(r, 429, "rate_limited")
    r = await api.client.post(f"/v1/sandboxes/{sid_b}/exec", json={"cmd": "true"}, headers=b)
    assert r.status_code == 200, r.text
    gate.open.set()
    assert [t.status_code for t in await asyncio.gather(*held)] == [200, 200]
    r = await api.client.post(f"/v1/sandboxes/{sid_a}/exec/stream", json={"cmd": "true"},
                              headers=a)
    assert r.status_code == 200 and "event: exit" in r.text
    assert api.app.state.service.exec_slots.held("a") == 0


async def test_a_team_past_its_open_streams_gets_429_until_one_ends(
        api: Api, gate: Gate) -> None:
    a, sid_a = await team_sandbox(api, "a")
    b, sid_b = await team_sandbox(api, "b")
    url = "/v1/sandboxes/{}/files/watch"
    first = asyncio.create_task(api.client.get(url.format(sid_a), params={"path": "/w"},
                                               headers=a))
    await gate.until(1)
    r = await api.client.get(url.format(sid_a), params={"path": "/w"}, headers=a)
    assert_envelope(r, 429, "rate_limited")
    assert "streams and terminals open" in r.json()["error"]["message"]
    second_team = asyncio.create_task(api.client.get(url.format(sid_b), params={"path": "/w"},
                                                     headers=b))
    await gate.until(2)  # team b's watch got in
    gate.open.set()
    assert (await first).status_code == 200
    assert (await second_team).status_code == 200
    assert api.app.state.service.stream_slots.held("a") == 0
    assert api.app.state.service.stream_slots.held("b") == 0


SPEC = {"from_template": "base", "steps": [{"kind": "run", "command": "echo hi"}]}


async def test_one_teams_builds_leave_a_build_slot_for_another_team(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    builder = ScriptedBuilder(runtime, gated=True)
    async with running_app(make_settings(tmp_path, max_concurrent_builds=2), runtime,
                           builder=builder) as api:
        a = api.headers(await api.new_key("a"))
        b = api.headers(await api.new_key("b"))
        builds = []
        for name in ("one", "two", "three"):
            r = await api.client.post("/v1/templates", json={"name": name, "spec": SPEC},
                                      headers=a)
            assert r.status_code == 202, r.text
            builds.append(r.json()["build_id"])
        r = await api.client.post("/v1/templates", json={"name": "mine", "spec": SPEC},
                                  headers=b)
        assert r.status_code == 202, r.text
        for _ in range(500):  # one build of team a and team b's are in the builder
            if len(builder.scopes) >= 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(builder.scopes) == ["a", "b"], builder.scopes
        builder.release.set()
        for build_id in builds:
            for _ in range(500):
                r = await api.client.get(f"/v1/templates/builds/{build_id}", headers=a)
                if r.json()["status"] != "building":
                    break
                await asyncio.sleep(0.01)
            assert r.json()["status"] == "ready", r.text
        assert sorted(builder.scopes) == ["a", "a", "a", "b"]
        r = await api.client.get(f"/v1/templates/builds/{builds[1]}/logs", headers=a)
        assert "waiting for this team's other builds" in r.text, r.text
