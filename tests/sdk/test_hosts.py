"""`client.hosts` (list, get, drain, undrain), both twins, against a real uvicorn server over a
cluster without VMs (tests/server/fake_cluster.py: the real SQLite registry, two in-memory
hosts) and over one in-memory host (tests/server/serve_fake.py). Fast."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.sdk import (
    AsyncClient,
    Client,
    ConflictError,
    DrainResult,
    HostInfo,
    NotFoundError,
    PermissionDeniedError,
)
from pandastack.server.store import open_store
from tests.server.fake_cluster import ENDPOINTS, STALE_AFTER_S, age
from tests.server.live import FakeServer, fake_server


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeServer]:
    with fake_server(tmp_path, module="tests.server.fake_cluster") as srv:
        yield srv


@pytest.fixture(scope="module")
def one_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-one-host")) as srv:
        yield srv


def states(hosts: list[HostInfo]) -> dict[str, str]:
    return {h.id: h.state for h in hosts}


def test_sync_twin(cluster: FakeServer, tmp_path: Path) -> None:
    with Client(cluster.url, cluster.admin_key) as client:
        hosts = client.hosts.list()
        assert [h.endpoint for h in hosts] == list(ENDPOINTS)
        assert all(isinstance(h, HostInfo) and h.state == "live" for h in hosts)
        a, b = (h.id for h in hosts)
        assert client.hosts.get(b).endpoint == ENDPOINTS[1]
        with pytest.raises(NotFoundError):
            client.hosts.get("host-nope")

        report = client.hosts.drain(a)
        assert report == DrainResult(host_id=a)  # no sandbox there: nothing to move
        assert states(client.hosts.list()) == {a: "draining", b: "live"}
        assert client.sandboxes.create(ttl_seconds=60).info.host_id == b
        undrained = client.hosts.undrain(a)
        assert (undrained.id, undrained.state) == (a, "live")

        store = open_store(f"sqlite:///{tmp_path / 'pandastack.db'}")
        try:
            age(store, b, 2 * STALE_AFTER_S)
        finally:
            store.close()
        assert states(client.hosts.list()) == {a: "live", b: "lost"}


async def test_async_twin(cluster: FakeServer) -> None:
    async with AsyncClient(cluster.url, cluster.admin_key) as client:
        a, b = (h.id for h in await client.hosts.list())
        assert (await client.hosts.get(a)).state == "live"
        assert await client.hosts.drain(b) == DrainResult(host_id=b)
        assert states(await client.hosts.list()) == {a: "live", b: "draining"}
        assert (await client.hosts.undrain(b)).state == "live"
        with pytest.raises(NotFoundError):
            await client.hosts.undrain("host-nope")


def test_only_admin_keys(cluster: FakeServer) -> None:
    with Client(cluster.url, cluster.admin_key) as admin:
        a = admin.hosts.list()[0].id
        secret = admin.keys.create("plain", team="team-a").key
    with Client(cluster.url, secret) as client:
        for call in (client.hosts.list, lambda: client.hosts.get(a),
                     lambda: client.hosts.drain(a), lambda: client.hosts.undrain(a)):
            with pytest.raises(PermissionDeniedError):
                call()


async def test_one_host_lists_none_and_refuses_drains(one_host: FakeServer) -> None:
    with Client(one_host.url, one_host.admin_key) as client:
        assert client.hosts.list() == []
        with pytest.raises(ConflictError, match="drives one host"):
            client.hosts.drain("host-0123456789ab")
    async with AsyncClient(one_host.url, one_host.admin_key) as aclient:
        assert await aclient.hosts.list() == []
        with pytest.raises(ConflictError, match="drives one host"):
            await aclient.hosts.undrain("host-0123456789ab")
