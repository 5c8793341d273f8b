"""The REST API over a `ClusterPool`: hosts come from the registry in the server's own
database (SQLite here; the store's registry tests cover PostgreSQL), and each host is the
in-memory fake. The fakes share one "object store" (snapshots and hibernations any of them
can restore), which is what the real hosts get from S3. What is tested is the pool's and the
service's bookkeeping: placement, routing, pinning, lost hosts, fencing, wake elsewhere and
drain. The same paths on real agents and VMs are in tests/cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from pandastack.hostport.errors import SandboxNotFound
from pandastack.registry.models import Host
from pandastack.server.hosts.cluster import ClusterPool
from pandastack.server.store import Store
from tests.server.conftest import assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, FakeSandbox


class SharedStoreHost(FakeRuntime):
    """A fake host whose hibernations go to a store shared by every host, like the real
    ones' object store: a host that does not know a sandbox wakes it from there."""

    def __init__(self, root: Path, saved: dict[str, FakeSandbox]) -> None:
        super().__init__(root)
        self.saved = saved

    async def hibernate(self, sandbox_id: str) -> None:
        await super().hibernate(sandbox_id)
        self.saved[sandbox_id] = self.sandbox(sandbox_id)

    async def wake(self, sandbox_id: str) -> None:
        if sandbox_id not in self.sandboxes:
            try:
                self.sandboxes[sandbox_id] = self.saved.pop(sandbox_id)
            except KeyError:
                raise SandboxNotFound(sandbox_id) from None
        await super().wake(sandbox_id)


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.saved: dict[str, FakeSandbox] = {}
        self.fakes = {name: SharedStoreHost(tmp / name, self.saved) for name in ("a", "b")}
        self.fakes["b"].snapshots = self.fakes["a"].snapshots  # one store of snapshots
        self.ids: dict[str, str] = {}

    def register(self, store: Store) -> None:
        for name in self.fakes:
            host = store.register_host(f"fake:{name}", vcpus=8, memory_mb=16384, disk_mb=10000)
            self.ids[name] = host.id

    def fake_of(self, host_id: str) -> SharedStoreHost:
        return next(self.fakes[n] for n, h in self.ids.items() if h == host_id)


def host_row(store: Store, host_id: str) -> Host:
    """The registry's row of a host this test registered (read afresh)."""
    host = store.get_host(host_id)
    assert host is not None
    return host


def age(store: Store, host_id: str, seconds: float) -> None:
    """Move the host's last heartbeat `seconds` into the past."""
    with store.session() as s:
        s.execute(update(Host).where(Host.id == host_id)
                  .values(last_heartbeat_at=Host.last_heartbeat_at - seconds))


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def pool_for(store: Store, cluster: Cluster) -> ClusterPool:
    cluster.register(store)
    return ClusterPool(store, lambda endpoint: cluster.fakes[endpoint.removeprefix("fake:")],
                       stale_after_s=15.0, refresh_s=0.0, loss_grace_s=0.0)


async def test_creates_spread_and_each_sandbox_names_its_host(tmp_path: Path,
                                                              cluster: Cluster) -> None:
    settings = make_settings(tmp_path, cluster=True)
    from pandastack.server.store import open_store
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    async with running_app(settings, pool) as api:
        c = api.client
        infos = [(await c.post("/v1/sandboxes", json={})).json() for _ in range(4)]
        on = {name: len(f.sandboxes) for name, f in cluster.fakes.items()}
        assert on == {"a": 2, "b": 2}
        for info in infos:
            assert info["host_id"] in cluster.ids.values()
            assert info["id"] in cluster.fake_of(info["host_id"]).sandboxes
            r = await c.post(f"/v1/sandboxes/{info['id']}/exec", json={"cmd": "true"})
            assert r.status_code == 200, r.text

        # An admin pins; a key of a team may not.
        b = cluster.ids["b"]
        pinned = [(await c.post("/v1/sandboxes", json={"host_id": b})).json()
                  for _ in range(2)]
        assert [p["host_id"] for p in pinned] == [b, b]
        key = await api.new_key("team-x")
        assert_envelope(await c.post("/v1/sandboxes", json={"host_id": b},
                                     headers=api.headers(key)), 403, "forbidden")
        on_a = next(i["id"] for i in infos if i["host_id"] == cluster.ids["a"])
        r = await c.post(f"/v1/sandboxes/{on_a}/fork", json={"count": 1, "host_id": b})
        assert r.status_code == 201, r.text
        child = r.json()["sandboxes"][0]
        assert child["host_id"] == b and child["id"] in cluster.fakes["b"].sandboxes
        assert_envelope(await c.post("/v1/sandboxes", json={"host_id": "host-none"}),
                        503, "unavailable")
        for row in (await c.get("/v1/sandboxes")).json()["sandboxes"]:
            if row["state"] == "running":
                assert (await c.delete(f"/v1/sandboxes/{row['id']}")).status_code == 204
        assert all(f.sandboxes == {} for f in cluster.fakes.values())
    store.close()


async def test_a_lost_host_is_fenced_once_and_its_sandboxes_are_host_lost(
        tmp_path: Path, cluster: Cluster) -> None:
    settings = make_settings(tmp_path, cluster=True)
    from pandastack.server.store import open_store
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    a, b = cluster.ids["a"], cluster.ids["b"]
    async with running_app(settings, pool) as api:
        c = api.client
        plain = (await c.post("/v1/sandboxes", json={"host_id": a})).json()["id"]
        saved = (await c.post("/v1/sandboxes", json={"host_id": a,
                                                      "persistent": True})).json()["id"]
        assert (await c.post(f"/v1/sandboxes/{saved}/hibernate")).status_code == 200
        r = await c.post("/v1/volumes", json={"name": "data", "host_id": a, "size_mb": 64})
        assert r.status_code == 201, r.text
        mounted = (await c.post("/v1/sandboxes", json={
            "persistent": True, "volumes": [{"name": "data", "mount_path": "/data"}]})).json()
        assert mounted["host_id"] == a
        assert (await c.post(f"/v1/sandboxes/{mounted['id']}/hibernate")).status_code == 200
        for sid in (plain, saved, mounted["id"]):  # what the agent does at create
            assert store.lease(sid, a, host_row(store, a).epoch)
        epoch = host_row(store, a).epoch

        age(store, a, 60)
        await pool.refresh(force=True)
        await pool.refresh(force=True)  # a second look must not fence it again
        assert host_row(store, a).epoch == epoch + 1
        assert all(lease.epoch == epoch + 1 for lease in store.host_leases(a))

        # The reaper marks them; requests get a clear 409; new creates go to b.
        for _ in range(50):
            states = {s: (await c.get(f"/v1/sandboxes/{s}")).json()["state"]
                      for s in (plain, saved, mounted["id"])}
            if set(states.values()) == {"host_lost"}:
                break
            await pool.refresh(force=True)
        assert set(states.values()) == {"host_lost"}, states
        assert_envelope(await c.post(f"/v1/sandboxes/{plain}/exec", json={"cmd": "true"}),
                        409, "host_lost")
        assert (await c.post("/v1/sandboxes", json={})).json()["host_id"] == b

        # One that saved nothing cannot come back; the hibernated one wakes on b.
        assert_envelope(await c.post(f"/v1/sandboxes/{plain}/wake"), 409, "host_lost")
        r = await c.post(f"/v1/sandboxes/{saved}/wake")
        assert r.status_code == 200, r.text
        info = (await c.get(f"/v1/sandboxes/{saved}")).json()
        assert info["state"] == "running" and info["host_id"] == b
        assert saved in cluster.fakes["b"].sandboxes
        r = await c.post(f"/v1/sandboxes/{saved}/exec", json={"cmd": "true"})
        assert r.status_code == 200, r.text
        # One whose volume is on the lost host cannot come back without it; killed, it
        # lets go of the volume (which comes back with its host).
        r = await c.post(f"/v1/sandboxes/{mounted['id']}/wake")
        assert_envelope(r, 409, "host_lost")
        assert "volume" in r.json()["error"]["message"]
        assert mounted["id"] not in cluster.fakes["b"].sandboxes
        assert (await c.delete(f"/v1/sandboxes/{mounted['id']}")).status_code == 204
        assert (await c.get("/v1/volumes/data")).json()["attachments"] == []
        # Killing a host_lost sandbox needs no host: it ends.
        assert (await c.delete(f"/v1/sandboxes/{plain}")).status_code == 204
        assert (await c.get(f"/v1/sandboxes/{plain}")).json()["state"] == "killed"
    store.close()


async def test_drain_moves_running_sandboxes_under_their_ids(tmp_path: Path,
                                                             cluster: Cluster) -> None:
    from pandastack.server.hosts.drain import drain
    settings = make_settings(tmp_path, cluster=True)
    from pandastack.server.store import open_store
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    a, b = cluster.ids["a"], cluster.ids["b"]
    async with running_app(settings, pool) as api:
        c = api.client
        running = (await c.post("/v1/sandboxes", json={"host_id": a})).json()["id"]
        paused = (await c.post("/v1/sandboxes", json={"host_id": a})).json()["id"]
        asleep = (await c.post("/v1/sandboxes", json={"host_id": a})).json()["id"]
        assert (await c.post(f"/v1/sandboxes/{paused}/pause")).status_code == 200
        assert (await c.post(f"/v1/sandboxes/{asleep}/hibernate")).status_code == 200
        r = await c.put(f"/v1/sandboxes/{running}/files", params={"path": "/w/f"},
                        content=b"kept")
        assert r.status_code == 200, r.text

        report = await drain(api.app.state.service, a)
        assert report.moved == {running: b, paused: b} and report.failed == {}
        assert report.stayed_hibernated == [asleep]
        fa, fb = cluster.fakes["a"], cluster.fakes["b"]
        assert set(fa.sandboxes) == {asleep} and {running, paused} <= set(fb.sandboxes)
        assert fb.sandboxes[running].files["/w/f"] == b"kept"
        assert fb.sandboxes[paused].state == "paused"
        got = {s: (await c.get(f"/v1/sandboxes/{s}")).json() for s in (running, paused)}
        assert {g["host_id"] for g in got.values()} == {b}
        assert got[paused]["state"] == "paused"
        # A draining host takes no new sandbox.
        new = (await c.post("/v1/sandboxes", json={})).json()
        assert new["host_id"] == b
        for sid in (running, paused, asleep, new["id"]):
            assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
        assert fa.sandboxes == {} and fb.sandboxes == {}
    store.close()


async def test_a_restarting_server_leaves_another_servers_create_under_way(
        tmp_path: Path, cluster: Cluster) -> None:
    """A row still `starting` may be another API server's create in flight: a server that
    starts only fails those older than any create may take."""
    import time

    from pandastack.server.store import Sandbox, open_store
    settings = make_settings(tmp_path, cluster=True)
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    now = time.time()

    def starting(sid: str, created_at: float) -> Sandbox:
        return Sandbox(id=sid, team="default", template="base", state="starting",
                       created_at=created_at, expires_at=created_at + 300, ttl_seconds=300,
                       persistent=False, vcpus=1, memory_mb=512, disk_mb=None, env={},
                       meta={}, last_activity_at=created_at, ended_at=None, end_reason=None,
                       snapshot=None, cwd=None, user=None)

    with store.session() as s:
        store.ensure_team(s, "default")
    store.add_sandbox(starting("sbx-00000000000a", now))
    store.add_sandbox(starting("sbx-00000000000b", now - 4000))
    async with running_app(settings, pool):
        assert store.sandbox_by_id("sbx-00000000000a").state == "starting"  # type: ignore[union-attr]
        assert store.sandbox_by_id("sbx-00000000000b").state == "failed"  # type: ignore[union-attr]
    store.close()


async def test_a_restarting_server_keeps_ready_templates_and_builds_under_way(
        tmp_path: Path, cluster: Cluster) -> None:
    """In a cluster a template's snapshot is in the object store, not only on the hosts up
    now, and a build may be another server's: neither is failed at start."""
    import time

    from pandastack.server.store import TemplateVersion, open_store
    settings = make_settings(tmp_path, cluster=True)
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    now = time.time()

    def version(build: str, status: str, created_at: float, number: int) -> TemplateVersion:
        return TemplateVersion(id=build, team="default", name="t", version=number,
                               status=status, snapshot_id="snap-0000000000aa"
                               if status == "ready" else None, env={}, cwd=None, user=None,
                               vcpus=None, memory_mb=None, error=None, steps_total=1,
                               steps_cached=0, created_at=created_at, finished_at=None)

    with store.session() as s:
        store.ensure_team(s, "default")
    rows = {"ready": version("bld-ready", "ready", now - 10, 1),
            "young": version("bld-young", "building", now - 10, 2),
            "old": version("bld-old", "building", now - 7 * 3600, 3)}
    for row in rows.values():
        store.add_template_version(row, {"steps": []})
    async with running_app(settings, pool):
        status = {k: store.get_template_build("default", r.id).status  # type: ignore[union-attr]
                  for k, r in rows.items()}
    assert status == {"ready": "ready", "young": "building", "old": "failed"}
    store.close()


async def test_the_other_server_follows_a_move_at_its_next_guest_call(
        tmp_path: Path, cluster: Cluster) -> None:
    """Server two has the sandbox cached on host a; server one moves it to b (drain): two's
    next exec, which does not retry, must go to b (the row it reads names b)."""
    from pandastack.server.hosts.drain import drain
    from pandastack.server.store import open_store
    settings = make_settings(tmp_path / "one", cluster=True)
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    other = ClusterPool(store, lambda e: cluster.fakes[e.removeprefix("fake:")],
                        stale_after_s=15.0, refresh_s=0.0, loss_grace_s=0.0)
    a, b = cluster.ids["a"], cluster.ids["b"]
    async with running_app(settings, pool) as one:
        two_settings = make_settings(tmp_path / "two", cluster=True, db_url=settings.dsn)
        async with running_app(two_settings, other, one.admin_key) as two:
            sid = (await one.client.post("/v1/sandboxes", json={"host_id": a})).json()["id"]
            r = await two.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
            assert r.status_code == 200, r.text
            assert other.host_of(sid) == a
            report = await drain(one.app.state.service, a)
            assert report.moved == {sid: b}
            r = await two.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})
            assert r.status_code == 200, r.text
            assert (await two.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    store.close()
