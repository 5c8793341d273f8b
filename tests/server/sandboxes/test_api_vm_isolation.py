"""Tenant isolation through the REST API, on real microVMs: a snapshot, a template and the
internal snapshots behind them are reachable only by their own team, whether named in a
create or as the base of a build. Team A owns a sandbox holding a secret, a snapshot of it and
a template built from that snapshot; team B knows every id and gets 404 for each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.server.conftest import Api, assert_envelope
from tests.server.vm_app import vm_app

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

# `make test` runs it in-process only (`soak` marks the agent mode, tests/lanes.py): which team
# may name a snapshot, a template or their internal snapshots is the server's store and
# routes, the same over either host port (15 s of a loaded run in agent mode).
MAKE_TEST_MODE = {"test_snapshots_and_templates_stay_with_their_team": "in-process"}

SECRET = b"team-a-secret"


@pytest.fixture(scope="module")
async def api(host_mode: str) -> AsyncIterator[Api]:
    # No step cache kept: every cache snapshot a build takes is pruned when it ends, so the
    # test can assert that no layer is left behind.
    async with vm_app(host_mode, build_cache_entries=0) as a:
        yield a


def build_body(name: str, base: str) -> dict[str, object]:
    return {"name": name, "network": {"internet": False},
            "spec": {"from_template": base, "steps": [{"kind": "run", "command": "true"}]}}


async def built(api: Api, headers: dict[str, str], body: dict[str, object]) -> dict[str, object]:
    r = await api.client.post("/v1/templates", json=body, headers=headers)
    assert r.status_code == 202, r.text
    build_id = r.json()["build_id"]
    deadline = time.monotonic() + 300
    while True:
        info: dict[str, object] = (await api.client.get(
            f"/v1/templates/builds/{build_id}", headers=headers)).json()
        if info["status"] != "building":
            return info
        assert time.monotonic() < deadline, info
        await asyncio.sleep(0.5)


async def test_snapshots_and_templates_stay_with_their_team(api: Api) -> None:
    c = api.client
    a = api.headers(await api.new_key("iso-team-a"))
    b = api.headers(await api.new_key("iso-team-b"))
    made: list[str] = []
    snap_id = None
    try:
        r = await c.post("/v1/sandboxes", json={"ttl_seconds": 600}, headers=a)
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
        r = await c.put(f"/v1/sandboxes/{made[0]}/files", params={"path": "/work/secret"},
                        content=SECRET, headers=a)
        assert r.status_code == 200, r.text
        r = await c.post(f"/v1/sandboxes/{made[0]}/snapshots", json={}, headers=a)
        assert r.status_code == 201, r.text
        snap_id = r.json()["id"]

        # B, knowing A's snapshot id: neither a create nor a build may start from it.
        assert_envelope(await c.post("/v1/sandboxes", json={"snapshot": snap_id},
                                     headers=b), 404, "not_found")
        assert_envelope(await c.post("/v1/templates", headers=b, json=build_body(
            "stolen", f"snapshot:{snap_id}")), 404, "not_found")

        # A may build from its own snapshot; the template holds A's file.
        info = await built(api, a, build_body("a-app", f"snapshot:{snap_id}"))
        assert info["status"] == "ready", info
        row = api.app.state.store.template_versions("iso-team-a", "a-app")[-1]
        internal = row.snapshot_id
        assert internal
        r = await c.post("/v1/sandboxes", json={"template": "a-app", "ttl_seconds": 600},
                         headers=a)
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
        r = await c.get(f"/v1/sandboxes/{made[-1]}/files", params={"path": "/work/secret"},
                        headers=a)
        assert r.status_code == 200 and r.content == SECRET, r.text

        # A template's snapshot is internal: not addressable by id, not even by its team;
        # and B cannot name A's template, as a create or as a base.
        for headers in (a, b):
            assert_envelope(await c.post("/v1/sandboxes", json={"snapshot": internal},
                                         headers=headers), 404, "not_found")
            assert_envelope(await c.post("/v1/templates", headers=headers, json=build_body(
                "internal", f"snapshot:{internal}")), 404, "not_found")
        assert_envelope(await c.post("/v1/sandboxes", json={"template": "a-app"}, headers=b),
                        404, "not_found")
        assert_envelope(await c.post("/v1/templates", headers=b,
                                     json=build_body("stolen", "a-app")), 404, "not_found")
        # A builds on its own template by name.
        info = await built(api, a, build_body("a-app-2", "a-app"))
        assert info["status"] == "ready", info
        assert (await c.get("/v1/templates", headers=b)).json()["templates"] == []
    finally:
        for sid in made:
            await c.delete(f"/v1/sandboxes/{sid}", headers=a)
        if snap_id is not None:
            await c.delete(f"/v1/snapshots/{snap_id}", headers=a)
        for name in ("a-app", "a-app-2"):
            await c.delete(f"/v1/templates/{name}", headers=a)
