"""`/v1/hosts`: admin keys only; a server that drives one host lists none and refuses drains
with 409; over a cluster (a `ClusterPool` over the real SQLite registry, two in-memory hosts:
tests/server/fake_cluster.py) every registered host is listed with its state, drain and
undrain flip it (and placement follows), and a host whose heartbeat is old is `lost`.

Moving a running sandbox needs real VMs and an object store: here a drain moves nothing, or
fails to move (an in-memory host has no object store to wake from) and leaves the sandbox
running where it was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pandastack.hostport.compat import HOST_PROTOCOL, OLDEST_HOST_PROTOCOL, Levels
from pandastack.server.app import create_app
from pandastack.server.settings import Settings
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fake_cluster import (
    CAPACITY,
    ENDPOINTS,
    STALE_AFTER_S,
    FakeCluster,
    age,
    fake_cluster,
)
from tests.server.fakes import FakeRuntime

ROUTES = [("GET", "/v1/hosts"), ("GET", "/v1/hosts/{h}"), ("POST", "/v1/hosts/{h}/drain"),
          ("POST", "/v1/hosts/{h}/undrain")]


@dataclass
class ClusterApi:
    api: Api
    cluster: FakeCluster

    def host(self, index: int) -> str:
        return self.cluster.host_ids[ENDPOINTS[index]]


@pytest.fixture
async def one_host(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path / "sbx")) as api:
        yield api


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[ClusterApi]:
    settings = make_settings(tmp_path)
    with fake_cluster(settings, tmp_path) as c:
        try:
            async with running_app(settings, c.pool) as api:
                yield ClusterApi(api, c)
        finally:
            await c.pool.close()


async def states(api: Api) -> dict[str, str]:
    r = await api.client.get("/v1/hosts")
    assert r.status_code == 200, r.text
    return {h["id"]: h["state"] for h in r.json()["hosts"]}


async def create(api: Api) -> dict[str, object]:
    r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 600})
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


# -- a server that drives one host --------------------------------------------------------

async def test_one_host_lists_none_and_refuses_drains(one_host: Api) -> None:
    r = await one_host.client.get("/v1/hosts")
    assert r.status_code == 200 and r.json() == {"hosts": []}
    for action in ("drain", "undrain"):
        r = await one_host.client.post(f"/v1/hosts/host-0123456789ab/{action}")
        assert_envelope(r, 409, "conflict")
        assert "drives one host" in r.json()["error"]["message"]
    assert_envelope(await one_host.client.get("/v1/hosts/host-0123456789ab"), 404, "not_found")


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_a_key_that_is_not_admin_gets_403(one_host: Api, method: str, path: str) -> None:
    key = await one_host.new_key("team-a")
    r = await one_host.client.request(method, path.format(h="host-0123456789ab"),
                                      headers=one_host.headers(key))
    assert_envelope(r, 403)


async def test_a_key_that_is_not_admin_gets_403_on_a_cluster(cluster: ClusterApi) -> None:
    api, host = cluster.api, cluster.host(0)
    key = await api.new_key("team-a")
    for method, path in ROUTES:
        r = await api.client.request(method, path.format(h=host), headers=api.headers(key))
        assert_envelope(r, 403)
    assert set((await states(api)).values()) == {"live"}  # the refused drain did nothing


# -- a cluster ----------------------------------------------------------------------------

async def test_every_registered_host_is_listed_live(cluster: ClusterApi) -> None:
    r = await cluster.api.client.get("/v1/hosts")
    assert r.status_code == 200, r.text
    hosts = r.json()["hosts"]
    assert [(h["id"], h["endpoint"]) for h in hosts] == [
        (cluster.host(i), e) for i, e in enumerate(ENDPOINTS)]
    for h in hosts:
        assert (h["state"], h["vcpus"], h["memory_mb"], h["disk_mb"], h["version"],
                h["epoch"]) == ("live", 8, 16384, 100_000, "test", 1)
        assert 0 <= h["heartbeat_age_seconds"] < STALE_AFTER_S
    r = await cluster.api.client.get(f"/v1/hosts/{cluster.host(1)}")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got.pop("heartbeat_age_seconds") >= hosts[1].pop("heartbeat_age_seconds")
    assert got == hosts[1]
    assert_envelope(await cluster.api.client.get("/v1/hosts/host-nope"), 404, "not_found")


async def test_drain_and_undrain_flip_a_host_and_placement_follows(
        cluster: ClusterApi) -> None:
    api, a, b = cluster.api, cluster.host(0), cluster.host(1)
    r = await api.client.post(f"/v1/hosts/{a}/drain")
    assert r.status_code == 200, r.text
    assert r.json() == {"host_id": a, "moved": {}, "failed": {}, "stayed_hibernated": [],
                        "moved_live": []}
    assert await states(api) == {a: "draining", b: "live"}
    assert cluster.cluster.store.get_host(a).draining  # type: ignore[union-attr]

    made = [await create(api) for _ in range(3)]
    assert {m["host_id"] for m in made} == {b}  # nothing new goes to a draining host
    assert not cluster.cluster.fakes[ENDPOINTS[0]].sandboxes

    r = await api.client.post(f"/v1/hosts/{a}/undrain")
    assert r.status_code == 200, r.text
    assert (r.json()["id"], r.json()["state"]) == (a, "live")
    assert await states(api) == {a: "live", b: "live"}
    r = await api.client.post(f"/v1/hosts/{b}/drain")  # b's running sandboxes cannot move
    assert r.status_code == 200, r.text
    assert await states(api) == {a: "live", b: "draining"}


async def test_a_sandbox_that_cannot_move_stays_running_where_it_was(
        cluster: ClusterApi) -> None:
    api, a, b = cluster.api, cluster.host(0), cluster.host(1)
    await api.client.post(f"/v1/hosts/{b}/drain")
    sandbox = await create(api)
    assert sandbox["host_id"] == a
    await api.client.post(f"/v1/hosts/{b}/undrain")

    r = await api.client.post(f"/v1/hosts/{a}/drain")
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["moved"] == {} and report["stayed_hibernated"] == []
    assert set(report["failed"]) == {sandbox["id"]}
    r = await api.client.get(f"/v1/sandboxes/{sandbox['id']}")
    assert (r.json()["state"], r.json()["host_id"]) == ("running", a)
    assert not cluster.cluster.fakes[ENDPOINTS[1]].sandboxes
    r = await api.client.post(f"/v1/sandboxes/{sandbox['id']}/exec", json={"cmd": "true"})
    assert r.status_code == 200, r.text


async def test_a_host_whose_heartbeat_is_old_is_lost(cluster: ClusterApi) -> None:
    api, a, b = cluster.api, cluster.host(0), cluster.host(1)
    age(cluster.cluster.store, b, 2 * STALE_AFTER_S)
    assert await states(api) == {a: "live", b: "lost"}
    r = await api.client.get(f"/v1/hosts/{b}")
    assert r.json()["heartbeat_age_seconds"] >= 2 * STALE_AFTER_S
    await api.client.post(f"/v1/hosts/{b}/drain")
    assert (await states(api))[b] == "lost"  # lost says more than draining
    made = await create(api)
    assert made["host_id"] == a


async def test_a_stale_host_within_the_loss_grace_is_stale_not_live(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with fake_cluster(settings, tmp_path, loss_grace_s=STALE_AFTER_S) as c:
        try:
            async with running_app(settings, c.pool) as api:
                a, b = (c.host_ids[e] for e in ENDPOINTS)
                age(c.store, b, 2 * STALE_AFTER_S)
                assert await states(api) == {a: "live", b: "stale"}
                assert (await create(api))["host_id"] == a
        finally:
            await c.pool.close()


async def test_a_host_a_protocol_level_apart_takes_no_sandbox_and_says_why(
        cluster: ClusterApi) -> None:
    """An agent two host API levels behind (an upgrade that skipped one) registers again:
    the server lists it `incompatible` with the reason, places nothing there, pinned or not,
    and takes it back once it registers at a level it works with."""
    api, a, b = cluster.api, cluster.host(0), cluster.host(1)
    store = cluster.cluster.store
    store.register_host(ENDPOINTS[1], **CAPACITY, version="0.0.1",
                        levels=Levels.speaking(OLDEST_HOST_PROTOCOL - 1))
    r = await api.client.get(f"/v1/hosts/{b}")
    assert (r.json()["state"], r.json()["protocol"]) == ("incompatible",
                                                         OLDEST_HOST_PROTOCOL - 1)
    assert "upgrade the agent" in r.json()["incompatible_reason"]
    assert (await states(api))[a] == "live"
    assert {(await create(api))["host_id"] for _ in range(3)} == {a}
    r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 600, "host_id": b})
    assert_envelope(r, 503, "unavailable")
    assert "incompatible" in r.json()["error"]["message"]
    assert not cluster.cluster.fakes[ENDPOINTS[1]].sandboxes

    store.register_host(ENDPOINTS[1], **CAPACITY, version="test",
                        levels=Levels.speaking(HOST_PROTOCOL + 1))  # one ahead: works
    r = await api.client.get(f"/v1/hosts/{b}")
    assert (r.json()["state"], r.json()["incompatible_reason"]) == ("live", "")
    r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 600, "host_id": b})
    assert r.status_code == 201, r.text


async def test_drain_and_undrain_of_an_unknown_host_are_404(cluster: ClusterApi) -> None:
    for action in ("drain", "undrain"):
        r = await cluster.api.client.post(f"/v1/hosts/host-nope/{action}")
        assert_envelope(r, 404, "not_found")
    assert set((await states(cluster.api)).values()) == {"live"}


def test_operation_ids() -> None:
    paths = create_app(Settings()).openapi()["paths"]
    assert {(m.upper(), p, op["operationId"]) for p, ops in paths.items()
            if p.startswith("/v1/hosts") for m, op in ops.items()} == {
        ("GET", "/v1/hosts", "listHosts"), ("GET", "/v1/hosts/{host_id}", "getHost"),
        ("POST", "/v1/hosts/{host_id}/drain", "drainHost"),
        ("POST", "/v1/hosts/{host_id}/undrain", "undrainHost")}


async def test_a_paused_sandbox_that_cannot_move_stays_paused(cluster: ClusterApi) -> None:
    api, a, b = cluster.api, cluster.host(0), cluster.host(1)
    await api.client.post(f"/v1/hosts/{b}/drain")
    sandbox = await create(api)
    await api.client.post(f"/v1/hosts/{b}/undrain")
    r = await api.client.post(f"/v1/sandboxes/{sandbox['id']}/pause")
    assert r.status_code == 200, r.text

    r = await api.client.post(f"/v1/hosts/{a}/drain")
    assert set(r.json()["failed"]) == {sandbox["id"]}
    r = await api.client.get(f"/v1/sandboxes/{sandbox['id']}")
    assert (r.json()["state"], r.json()["host_id"]) == ("paused", a)
    assert cluster.cluster.fakes[ENDPOINTS[0]].sandboxes[str(sandbox["id"])].state == "paused"
