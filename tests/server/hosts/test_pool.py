"""The REST API over a pool of two hosts (the in-memory host, twice): creates spread, every
call reaches the sandbox's own host, what a snapshot or a fork makes stays with its source,
a full or unreachable host is skipped, and a host out of reach holds its sandboxes back from
the reconcile instead of losing them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pandastack.hostport.errors import HostExhausted, HostMemoryExhausted
from pandastack.server.hosts.pool import HostPool, _Held
from tests.server.conftest import assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, FakeSandbox
from tests.server.hosts.test_api_host_unavailable import Reachable


def two_hosts(tmp: Path) -> tuple[FakeRuntime, FakeRuntime, HostPool]:
    a, b = FakeRuntime(tmp / "a"), FakeRuntime(tmp / "b")
    return a, b, HostPool({"host-a": a, "host-b": b})


async def test_creates_spread_and_calls_reach_their_host(tmp_path: Path) -> None:
    a, b, pool = two_hosts(tmp_path)
    async with running_app(make_settings(tmp_path), pool) as api:
        c = api.client
        sids = [(await c.post("/v1/sandboxes", json={})).json()["id"] for _ in range(4)]
        assert len(a.sandboxes) == 2 and len(b.sandboxes) == 2
        for sid in sids:
            r = await c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/w/id"},
                            content=sid.encode())
            assert r.status_code == 200, r.text
            host = a if sid in a.sandboxes else b
            assert host.sandboxes[sid].files["/w/id"] == sid.encode()
            r = await c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
            assert r.status_code == 200, r.text

        # A snapshot and what is made from it, and a fork, stay on the source's host.
        src = sids[0]
        host = a if src in a.sandboxes else b
        snap = (await c.post(f"/v1/sandboxes/{src}/snapshots", json={})).json()["id"]
        child = (await c.post("/v1/sandboxes", json={"snapshot": snap})).json()["id"]
        assert child in host.sandboxes
        r = await c.post(f"/v1/sandboxes/{src}/fork", json={"count": 2})
        assert r.status_code in (200, 201), r.text
        for kid in r.json()["sandboxes"]:
            assert kid["id"] in host.sandboxes

        for row in (await c.get("/v1/sandboxes")).json()["sandboxes"]:
            assert (await c.delete(f"/v1/sandboxes/{row['id']}")).status_code == 204
        assert a.sandboxes == {} and b.sandboxes == {}


async def test_a_full_or_unreachable_host_is_skipped(tmp_path: Path) -> None:
    a, b = FakeRuntime(tmp_path / "a"), FakeRuntime(tmp_path / "b")
    down = Reachable(a)
    pool = HostPool({"host-a": down, "host-b": b})
    async with running_app(make_settings(tmp_path), pool) as api:
        down.down = True
        for _ in range(2):
            r = await api.client.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
        assert len(b.sandboxes) == 2 and a.sandboxes == {}

        async def exhausted(*args: object, **kwargs: object) -> None:
            raise HostExhausted("host-b: no room")

        b.create = exhausted  # type: ignore[assignment,method-assign]
        assert_envelope(await api.client.post("/v1/sandboxes", json={}), 503, "unavailable")
        down.down = False


async def test_a_host_out_of_reach_keeps_its_sandboxes_through_a_restart(
        tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    a, b = FakeRuntime(tmp_path / "a"), FakeRuntime(tmp_path / "b")
    async with running_app(settings, HostPool({"host-a": a, "host-b": b})) as api:
        sids = [(await api.client.post("/v1/sandboxes", json={})).json()["id"]
                for _ in range(2)]
    on_a = next(s for s in sids if s in a.sandboxes)
    on_b = next(s for s in sids if s in b.sandboxes)
    down = Reachable(a)
    down.down = True
    async with running_app(settings, HostPool({"host-a": down, "host-b": b})) as api:
        # host-a's sandbox is not ended as gone (the reaper runs every 0.2 s: several
        # passes), and host-b's works.
        await asyncio.sleep(1.0)
        rows = {r["id"]: r["state"] for r in (await api.client.get("/v1/sandboxes")).json()
                ["sandboxes"]}
        assert rows == {on_a: "running", on_b: "running"}
        r = await api.client.post(f"/v1/sandboxes/{on_b}/exec", json={"cmd": "true"})
        assert r.status_code == 200, r.text
        assert_envelope(await api.client.post(f"/v1/sandboxes/{on_a}/exec",
                                              json={"cmd": "true"}), 503, "host_unavailable")
        down.down = False  # back: the reaper's reconcile finds it there
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            r = await api.client.post(f"/v1/sandboxes/{on_a}/exec", json={"cmd": "true"})
            if r.status_code == 200:
                break
            assert asyncio.get_running_loop().time() < deadline, r.text
            await asyncio.sleep(0.1)


def test_a_pool_needs_a_host() -> None:
    with pytest.raises(ValueError):
        HostPool({})


async def test_a_listing_under_way_does_not_forget_a_sandbox_made_meanwhile(
        tmp_path: Path) -> None:
    """The reaper lists a host while a fork or create on it finishes: the listing began
    before that sandbox existed, so its absence there says nothing."""
    a, _b, pool = two_hosts(tmp_path)
    await pool.start()
    release = asyncio.Event()
    listing = a.list_sandboxes

    async def slow_listing() -> list[FakeSandbox]:
        found = await listing()
        await release.wait()
        return found

    a.list_sandboxes = slow_listing  # type: ignore[method-assign]
    learning = asyncio.create_task(pool._learn("host-a"))
    await asyncio.sleep(0)
    made = await a.create()  # as if the pool had placed it: recorded, then the listing ends
    pool._sandboxes[made.id] = _Held("host-a")
    release.set()
    await learning
    assert pool.host_of(made.id) == "host-a"


async def test_a_host_low_on_memory_is_passed_over(tmp_path: Path) -> None:
    """Its agent's memory admission (ADR 0050) refuses: the next host takes the create;
    when every host refuses, 503 naming each host's MemAvailable and reserve."""
    a, b, pool = two_hosts(tmp_path)

    def low_on_memory(host: str) -> object:
        async def refuse(*args: object, **kwargs: object) -> None:
            raise HostMemoryExhausted(what=f"create on {host}", available_mb=900,
                                      reserve_mb=1205, need_mb=40)
        return refuse

    a.create = low_on_memory("host-a")  # type: ignore[assignment,method-assign]
    async with running_app(make_settings(tmp_path), pool) as api:
        for _ in range(2):
            r = await api.client.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
        assert len(b.sandboxes) == 2 and a.sandboxes == {}
        b.create = low_on_memory("host-b")  # type: ignore[assignment,method-assign]
        r = await api.client.post("/v1/sandboxes", json={})
        assert_envelope(r, 503, "unavailable")
        message = r.json()["error"]["message"]
        for host in ("host-a", "host-b"):
            assert (f"{host}: create on {host}: refused, the host is low on memory: 900 MiB "
                    "available (MemAvailable)") in message, message
        assert "1205 MiB stay in reserve (PANDASTACK_MEMORY_RESERVE_MB)" in message
