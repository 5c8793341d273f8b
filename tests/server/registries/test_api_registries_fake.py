"""A team's registry credentials at the HTTP layer, over the in-memory host: stored sealed
(the database row holds no password), never read back (the answers and the list name the
registry and username only), kept apart per team (another team's is a 404 and is never
handed to its builds), handed to a build only for the registries its images come from, and
bad input, a missing key file or a replaced one answered with 4xx/503, never a 500 and never
with the password in it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pandastack.hostport.registries import RegistryLogin
from pandastack.server.registries.sealing import make_key_file
from pandastack.wire.registries import MAX_REGISTRY_CREDENTIALS_PER_TEAM
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, ScriptedBuilder

PASSWORD = "s3cret-Token-9f1c"
PATH = "/v1/registry-credentials"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "encryption.key"
    make_key_file(path)
    return path


@pytest.fixture
def runtime(tmp_path: Path) -> FakeRuntime:
    return FakeRuntime(tmp_path / "sandboxes")


@pytest.fixture
async def api(tmp_path: Path, key_file: Path, runtime: FakeRuntime) -> AsyncIterator[Api]:
    settings = make_settings(tmp_path, encryption_key_file=key_file)
    async with running_app(settings, runtime, builder=ScriptedBuilder(runtime)) as running:
        yield running


def no_password(r: httpx.Response) -> None:
    assert PASSWORD not in r.text, r.text


async def login(api: Api, registry: str, username: str = "alice", password: str = PASSWORD,
                key: str | None = None) -> httpx.Response:
    r = await api.client.put(f"{PATH}/{registry}", headers=api.headers(key),
                             json={"username": username, "password": password})
    no_password(r)
    return r


async def built(api: Api, name: str, base: str, key: str | None = None) -> dict[str, Any]:
    r = await api.client.post("/v1/templates", headers=api.headers(key),
                              json={"name": name, "spec": {"from_template": base}})
    assert r.status_code == 202, r.text
    for _ in range(500):
        info = (await api.client.get(f"/v1/templates/builds/{r.json()['build_id']}",
                                     headers=api.headers(key))).json()
        if info["status"] != "building":
            return dict(info)
        await asyncio.sleep(0.01)
    raise AssertionError("the build did not end")


async def test_credentials_are_stored_sealed_and_never_read_back(
        api: Api, tmp_path: Path) -> None:
    r = await login(api, "GHCR.io")
    assert r.status_code == 200, r.text
    stored = r.json()
    assert set(stored) == {"registry", "username", "created_at", "updated_at"}
    assert (stored["registry"], stored["username"]) == ("ghcr.io", "alice")
    r = await login(api, "127.0.0.1:5000", "bob")
    assert r.status_code == 200, r.text
    # Docker Hub under any of its names is one registry.
    assert (await login(api, "index.docker.io", "carol")).json()["registry"] == "docker.io"
    again = await login(api, "ghcr.io", "alice2", password=PASSWORD + "-new")
    assert again.json()["created_at"] == stored["created_at"]
    assert again.json()["updated_at"] >= stored["updated_at"]

    listed = await api.client.get(PATH)
    no_password(listed)
    assert [(c["registry"], c["username"]) for c in listed.json()["credentials"]] == [
        ("127.0.0.1:5000", "bob"), ("docker.io", "carol"), ("ghcr.io", "alice2")]
    with sqlite3.connect(tmp_path / "pandastack.db") as db:
        rows = db.execute("SELECT registry, secret FROM registry_credentials").fetchall()
    assert len(rows) == 3
    for _, secret in rows:
        assert secret.startswith("v1.") and PASSWORD not in secret

    r = await api.client.delete(f"{PATH}/ghcr.io")
    assert r.status_code == 204, r.text
    assert_envelope(await api.client.delete(f"{PATH}/ghcr.io"), 404, "not_found")
    listed = await api.client.get(PATH)
    assert [c["registry"] for c in listed.json()["credentials"]] == [
        "127.0.0.1:5000", "docker.io"]


async def test_another_teams_credentials_are_out_of_reach(
        api: Api, runtime: FakeRuntime) -> None:
    assert (await login(api, "ghcr.io")).status_code == 200
    other = await api.new_key("team-b")
    assert (await api.client.get(PATH, headers=api.headers(other))).json() == {
        "credentials": []}
    assert_envelope(await api.client.delete(f"{PATH}/ghcr.io", headers=api.headers(other)),
                    404, "not_found")
    # Team B's build of the same image gets none of team A's.
    info = await built(api, "app", "ghcr.io/acme/private:1", key=other)
    assert info["status"] == "ready", info
    assert runtime.build_logins == [{}]
    # A's row is still there, and A's build gets it.
    info = await built(api, "app", "ghcr.io/acme/private:1")
    assert info["status"] == "ready", info
    assert runtime.build_logins[-1] == {"ghcr.io": RegistryLogin("alice", PASSWORD)}


async def test_a_build_carries_only_its_images_registries(api: Api,
                                                          runtime: FakeRuntime) -> None:
    for registry, user in (("ghcr.io", "g"), ("docker.io", "d"), ("127.0.0.1:5000", "l")):
        assert (await login(api, registry, user)).status_code == 200
    assert (await built(api, "hub", "python:3.12-slim"))["status"] == "ready"
    assert (await built(api, "local", "127.0.0.1:5000/tests/x:v1"))["status"] == "ready"
    assert (await built(api, "ours", "base"))["status"] == "ready"
    assert runtime.build_logins == [{"docker.io": RegistryLogin("d", PASSWORD)},
                                    {"127.0.0.1:5000": RegistryLogin("l", PASSWORD)}, {}]
    # A multi-stage build: each stage's image registry, no others.
    r = await api.client.post("/v1/templates", json={"name": "multi", "spec": {
        "from_template": "base", "steps": [{"kind": "copy_from", "stage": 0,
                                            "sources": ["/x"], "dst": "/x"}],
        "stages": [{"from_template": "ghcr.io/acme/build:1", "steps": []}]}})
    assert r.status_code == 202, r.text
    for _ in range(500):
        if len(runtime.build_logins) == 4:
            break
        await asyncio.sleep(0.01)
    assert runtime.build_logins[-1] == {"ghcr.io": RegistryLogin("g", PASSWORD)}
    assert repr(runtime.build_logins[-1]).count(PASSWORD) == 0


@pytest.mark.parametrize(("registry", "body"), [
    ("ghcr.io", {"username": "a:b", "password": PASSWORD}),
    ("ghcr.io", {"username": "", "password": PASSWORD}),
    ("ghcr.io", {"username": "a", "password": ""}),
    ("ghcr.io", {"username": "a", "password": PASSWORD + "\n"}),
    ("ghcr.io", {"username": "a", "password": PASSWORD + "x" * 9000}),
    ("ghcr.io", {"username": "a", "password": PASSWORD, "email": "a@b"}),
    ("ghcr.io", {"username": "a"}),
    ("ghcr.io", {"username": "a", "password": 7}),
    ("https:ghcr.io", {"username": "a", "password": PASSWORD}),
    ("ghcr.io:99999", {"username": "a", "password": PASSWORD}),
    ("bad_host", {"username": "a", "password": PASSWORD}),
    ("x" * 300, {"username": "a", "password": PASSWORD}),
])
async def test_bad_input_is_a_422_without_the_password(api: Api, registry: str,
                                                      body: dict[str, Any]) -> None:
    r = await api.client.put(f"{PATH}/{registry}", json=body)
    assert_envelope(r, 422, "validation_error")
    no_password(r)
    assert (await api.client.get(PATH)).json() == {"credentials": []}


async def test_a_bad_registry_name_on_delete_is_a_422(api: Api) -> None:
    assert_envelope(await api.client.delete(f"{PATH}/not_a_host"), 422, "validation_error")


async def test_a_team_holds_a_bounded_number(api: Api) -> None:
    for n in range(MAX_REGISTRY_CREDENTIALS_PER_TEAM):
        assert (await login(api, f"r{n}.example.com")).status_code == 200
    assert_envelope(await login(api, "one-more.example.com"), 409, "conflict")
    assert (await login(api, "r0.example.com", "new")).status_code == 200  # a replacement


async def test_without_a_key_file_it_says_what_to_run(tmp_path: Path,
                                                      runtime: FakeRuntime) -> None:
    settings = make_settings(tmp_path, encryption_key_file=tmp_path / "none.key")
    async with running_app(settings, runtime, builder=ScriptedBuilder(runtime)) as api:
        r = await login(api, "ghcr.io")
        assert_envelope(r, 503, "unavailable")
        assert "`pandastack setup`" in r.json()["error"]["message"]
        assert (await api.client.get(PATH)).json() == {"credentials": []}
        # Builds that need no stored credentials go on.
        assert (await built(api, "hub", "python:3.12-slim"))["status"] == "ready"


async def test_a_replaced_key_file_is_named_at_the_build(tmp_path: Path, key_file: Path,
                                                         runtime: FakeRuntime) -> None:
    settings = make_settings(tmp_path, encryption_key_file=key_file)
    async with running_app(settings, runtime, builder=ScriptedBuilder(runtime)) as api:
        assert (await login(api, "ghcr.io")).status_code == 200
    key_file.unlink()
    make_key_file(key_file)
    async with running_app(settings, runtime, builder=ScriptedBuilder(runtime)) as api:
        r = await api.client.post("/v1/templates", json={
            "name": "app", "spec": {"from_template": "ghcr.io/acme/private:1"}})
        assert_envelope(r, 409, "conflict")
        message = r.json()["error"]["message"]
        assert "registry ghcr.io" in message and "key file was replaced" in message
        assert "log in to ghcr.io again" in message
        # Logging in again seals with the new key; the build then gets the login.
        assert (await login(api, "ghcr.io")).status_code == 200
        assert (await built(api, "app", "ghcr.io/acme/private:1"))["status"] == "ready"
        assert runtime.build_logins == [{"ghcr.io": RegistryLogin("alice", PASSWORD)}]
