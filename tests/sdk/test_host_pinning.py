"""`host_id` on create, get-or-create and fork, in both twins and through `client.sandboxes`:
an admin key places the sandbox (or the fork's children) on the host it names, a team's key
gets `PermissionDeniedError` (the REST API's 403) and nothing is made. Against a real uvicorn
server over a cluster without VMs (tests/server/fake_cluster.py: the real SQLite registry, two
in-memory hosts)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pandastack.sdk import AsyncClient, AsyncSandbox, Client, PermissionDeniedError, Sandbox
from tests.sdk_credentials import Credentials
from tests.server.live import FakeServer, fake_server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-pinning"),
                     module="tests.server.fake_cluster") as srv:
        yield srv


def host_ids(srv: FakeServer) -> tuple[str, str]:
    with Client(srv.url, srv.admin_key) as client:
        a, b = (h.id for h in client.hosts.list())
    return a, b


def team_key(srv: FakeServer, team: str) -> str:
    with Client(srv.url, srv.admin_key) as client:
        return client.keys.create("plain", team=team).key


def live_ids(srv: FakeServer, key: str) -> set[str]:
    with Client(srv.url, key) as client:
        return {s.id for s in client.sandboxes.list()}


def test_sync_admin_places_and_team_key_is_refused(cluster: FakeServer) -> None:
    a, b = host_ids(cluster)
    conn: Credentials = {"api_url": cluster.url, "api_key": cluster.admin_key}
    for host in (a, b):  # both hosts: the pin, not the placement's own choice, decides
        with Sandbox.create(ttl_seconds=60, host_id=host, **conn) as sbx:
            assert sbx.info.host_id == host
            children = sbx.fork(2, host_id=host)
            try:
                assert [c.info.host_id for c in children] == [host, host]
            finally:
                for child in children:
                    child.kill()
                    child.close()
    with Client(cluster.url, cluster.admin_key) as client:
        made = client.sandboxes.create(ttl_seconds=60, host_id=b)
        named = client.sandboxes.get_or_create("pinned-sync", ttl_seconds=60, host_id=a)
        named_too = Sandbox.get_or_create("pinned-sync-2", ttl_seconds=60, host_id=b, **conn)
        assert (made.info.host_id, named.info.host_id, named_too.info.host_id) == (b, a, b)
        for sbx in (made, named, named_too):
            sbx.kill()
        named_too.close()

    key = team_key(cluster, "team-pin-sync")
    with Sandbox.create(ttl_seconds=60, api_url=cluster.url, api_key=key) as own:
        before = live_ids(cluster, key)
        with pytest.raises(PermissionDeniedError):
            own.fork(host_id=a)
        with pytest.raises(PermissionDeniedError):
            Sandbox.create(ttl_seconds=60, host_id=a, api_url=cluster.url, api_key=key)
        with Client(cluster.url, key) as client:
            with pytest.raises(PermissionDeniedError):
                client.sandboxes.create(ttl_seconds=60, host_id=b)
            with pytest.raises(PermissionDeniedError):
                client.sandboxes.get_or_create("refused", ttl_seconds=60, host_id=b)
        assert live_ids(cluster, key) == before == {own.id}


async def test_async_admin_places_and_team_key_is_refused(cluster: FakeServer) -> None:
    a, b = host_ids(cluster)
    conn: Credentials = {"api_url": cluster.url, "api_key": cluster.admin_key}
    async with await AsyncSandbox.create(ttl_seconds=60, host_id=b, **conn) as sbx:
        assert sbx.info.host_id == b
        children = await sbx.fork(host_id=b)
        try:
            assert [c.info.host_id for c in children] == [b]
        finally:
            for child in children:
                await child.kill()
                await child.close()
    async with AsyncClient(cluster.url, cluster.admin_key) as client:
        made = await client.sandboxes.create(ttl_seconds=60, host_id=a)
        named = await client.sandboxes.get_or_create("pinned-async", ttl_seconds=60, host_id=b)
        named_too = await AsyncSandbox.get_or_create("pinned-async-2", ttl_seconds=60,
                                                     host_id=a, **conn)
        assert (made.info.host_id, named.info.host_id, named_too.info.host_id) == (a, b, a)
        for one in (made, named, named_too):
            await one.kill()
        await named_too.close()

    key = team_key(cluster, "team-pin-async")
    async with await AsyncSandbox.create(ttl_seconds=60, api_url=cluster.url,
                                         api_key=key) as own:
        with pytest.raises(PermissionDeniedError):
            await own.fork(host_id=b)
        with pytest.raises(PermissionDeniedError):
            await AsyncSandbox.create(ttl_seconds=60, host_id=b, api_url=cluster.url,
                                      api_key=key)
        async with AsyncClient(cluster.url, key) as client:
            with pytest.raises(PermissionDeniedError):
                await client.sandboxes.create(ttl_seconds=60, host_id=a)
        assert live_ids(cluster, key) == {own.id}
