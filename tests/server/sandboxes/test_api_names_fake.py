"""Sandboxes by name over the HTTP layer with the in-memory host, on SQLite and PostgreSQL:
create with a name, 409 for a second live one, lookup by id or name, get-or-create (200 or
201), ten concurrent get-or-creates making one sandbox, a hibernated one woken, a name freed
by a kill, names per team, and bad names (422, never a 500)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


@pytest.fixture
def runtime(tmp_path: Path) -> FakeRuntime:
    return FakeRuntime(tmp_path)


@pytest.fixture
async def api(tmp_path: Path, db: str, runtime: FakeRuntime) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path, db_url=db), runtime) as a:
        yield a


async def test_names(api: Api, runtime: FakeRuntime) -> None:
    c = api.client
    r = await c.post("/v1/sandboxes", json={"name": "user-42", "metadata": {"k": "v"}})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["name"] == "user-42"
    assert_envelope(await c.post("/v1/sandboxes", json={"name": "user-42"}), 409, "conflict")
    for path in (f"/v1/sandboxes/{made['id']}", "/v1/sandboxes/user-42",
                 "/v1/sandboxes/by-name/user-42"):
        assert (await c.get(path)).json()["id"] == made["id"]

    r = await c.put("/v1/sandboxes/by-name/user-42", json={})
    assert (r.status_code, r.json()["id"]) == (200, made["id"])
    await c.post(f"/v1/sandboxes/{made['id']}/hibernate")
    r = await c.put("/v1/sandboxes/by-name/user-42", json={})
    assert (r.status_code, r.json()["id"], r.json()["state"]) == (200, made["id"], "running")

    # Killed, the name is free: the next get-or-create makes another sandbox under it.
    assert (await c.delete(f"/v1/sandboxes/{made['id']}")).status_code == 204
    assert_envelope(await c.get("/v1/sandboxes/by-name/user-42"), 404, "not_found")
    r = await c.put("/v1/sandboxes/by-name/user-42", json={"metadata": {"n": "2"}})
    assert r.status_code == 201, r.text
    again = r.json()
    assert again["id"] != made["id"] and again["metadata"] == {"n": "2"}

    # Another team has names of its own.
    other = api.headers(await api.new_key("names-other"))
    r = await c.put("/v1/sandboxes/by-name/user-42", json={}, headers=other)
    assert r.status_code == 201 and r.json()["id"] != again["id"]
    assert_envelope(await c.get(f"/v1/sandboxes/{again['id']}", headers=other), 404)

    for bad in ("sbx-0123456789ab", "-x", "a" * 64, "with space", "ünï"):
        assert_envelope(await c.post("/v1/sandboxes", json={"name": bad}), 422,
                        "validation_error")
    for bad_path in ("sbx-0123456789ab", "-x", "a" * 64):
        r = await c.put(f"/v1/sandboxes/by-name/{bad_path}", json={})
        assert r.status_code == 422, r.text
    assert_envelope(await c.put("/v1/sandboxes/by-name/a", json={"name": "b"}), 422,
                    "validation_error")


async def test_concurrent_get_or_create_makes_one_sandbox(api: Api,
                                                          runtime: FakeRuntime) -> None:
    c = api.client
    answers = await asyncio.gather(*(c.put("/v1/sandboxes/by-name/same", json={})
                                     for _ in range(10)))
    assert all(r.status_code in (200, 201) for r in answers), [r.text for r in answers]
    assert sorted(r.status_code for r in answers) == [200] * 9 + [201]
    assert len({r.json()["id"] for r in answers}) == 1
    assert len(runtime.sandboxes) == 1
