"""The SDK's pause/resume, hibernate/wake, snapshot, fork and `client.snapshots`, both twins,
against a real uvicorn server over the in-memory runtime (tests/server/serve_fake.py). Fast."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from pandastack.sdk import (
    AsyncClient,
    AsyncSandbox,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
    _base,
)
from tests.server.live import FakeServer, fake_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("sdk-snap")) as srv:
        yield srv


def test_sync_twin(server: FakeServer) -> None:
    kw = {"api_url": server.url, "api_key": server.admin_key}
    with Sandbox.create(ttl_seconds=600, metadata={"k": "v"}, **kw) as sbx:  # type: ignore[arg-type]
        sbx.filesystem.write("/w/a", "parent")
        assert sbx.pause().state == "paused" and sbx.info.state == "paused"
        with pytest.raises(ConflictError):
            sbx.exec("true")
        assert sbx.resume().state == "running"
        assert sbx.hibernate().state == "hibernated"
        assert sbx.exec("true").exit_code == 0  # wakes it
        assert sbx.refresh().state == "running"
        sbx.hibernate()
        assert sbx.wake().state == "running"

        snap_id = sbx.snapshot(name="s1")
        assert snap_id.startswith("snap-")
        with Client(**kw) as client:  # type: ignore[arg-type]
            info = client.snapshots.get(snap_id)
            assert info.name == "s1" and info.source_sandbox == sbx.id
            assert [s.id for s in client.snapshots.list()] == [snap_id]
            with Sandbox.create(snapshot=snap_id, **kw) as restored:  # type: ignore[arg-type]
                assert restored.info.snapshot == snap_id
                assert restored.filesystem.read("/w/a") == b"parent"
            made = client.sandboxes.create(snapshot=snap_id, ttl_seconds=60)
            assert made.info.snapshot == snap_id and made.info.ttl_seconds == 60
            made.kill()
            with pytest.raises(InvalidRequestError):
                Sandbox.create(template="other", snapshot=snap_id, **kw)  # type: ignore[arg-type]
            client.snapshots.delete(snap_id)
            with pytest.raises(NotFoundError):
                client.snapshots.get(snap_id)
            with pytest.raises(NotFoundError):
                Sandbox.create(snapshot=snap_id, **kw)  # type: ignore[arg-type]
            assert client.snapshots.list() == []

        children = sbx.fork(count=2)
        try:
            assert len({c.id for c in children} | {sbx.id}) == 3
            # what the server measured comes with the list (the fake host pauses 1.5 ms)
            assert children.parent_pause_ms == 1.5 and children.duration_ms > 0
            for child in children:
                assert child.info.metadata == {"k": "v"}
                assert child.filesystem.read("/w/a") == b"parent"
        finally:
            for child in children:
                child.kill()
                child.close()
        with pytest.raises(InvalidRequestError):
            sbx.fork(count=17)  # refused before anything is sent
    with Client(**kw) as client:  # type: ignore[arg-type]
        killed = client.sandboxes.connect(sbx.id)
        with pytest.raises(ConflictError):
            killed.fork()  # the parent was killed on leaving the block
        with pytest.raises(ConflictError):
            killed.snapshot()


async def test_async_twin(server: FakeServer) -> None:
    kw = {"api_url": server.url, "api_key": server.admin_key}
    async with await AsyncSandbox.create(ttl_seconds=600, **kw) as sbx:  # type: ignore[arg-type]
        await sbx.filesystem.write("/w/a", "parent")
        assert (await sbx.pause()).state == "paused"
        assert (await sbx.resume()).state == "running"
        assert (await sbx.hibernate()).state == "hibernated"
        assert (await sbx.exec("true")).exit_code == 0
        assert (await sbx.refresh()).state == "running"
        await sbx.hibernate()
        assert (await sbx.wake()).state == "running"
        snap_id = await sbx.snapshot()
        async with AsyncClient(**kw) as client:  # type: ignore[arg-type]
            assert (await client.snapshots.get(snap_id)).name is None
            assert [s.id for s in await client.snapshots.list()] == [snap_id]
            restored = await client.sandboxes.create(snapshot=snap_id)
            assert await restored.filesystem.read("/w/a") == b"parent"
            await restored.kill()
            await client.snapshots.delete(snap_id)
            assert await client.snapshots.list() == []
        children = await sbx.fork(count=2)
        assert children.parent_pause_ms == 1.5 and children.duration_ms > 0
        for child in children:
            assert await child.filesystem.read("/w/a") == b"parent"
            await child.kill()
            await child.close()
        parent_id = sbx.id
    async with AsyncClient(**kw) as client:  # type: ignore[arg-type]
        killed = await client.sandboxes.connect(parent_id)
        with pytest.raises(ConflictError):
            await killed.fork()


def test_calls() -> None:
    """The requests the SDK sends."""
    call = _base.create_sandbox_call(template="base", ttl_seconds=None, persistent=False,
                                     vcpus=None, memory_mb=None, disk_mb=None, env=None,
                                     metadata=None, snapshot="snap-0123456789ab")
    assert call.json == {"snapshot": "snap-0123456789ab", "persistent": False}
    assert _base.fork_call("sbx-1", 3).json == {"count": 3}
    assert _base.fork_call("sbx-1", 3).path == "/v1/sandboxes/sbx-1/fork"
    assert _base.snapshot_call("sbx-1", None).json == {}
    assert _base.snapshot_call("sbx-1", "n").json == {"name": "n"}
    assert _base.state_call("sbx-1", "hibernate").path == "/v1/sandboxes/sbx-1/hibernate"
    assert _base.delete_snapshot_call("snap/x").path == "/v1/snapshots/snap%2Fx"
    with pytest.raises(InvalidRequestError):
        _base.fork_call("sbx-1", 0)


def test_fork_children_of_a_client_share_its_connections(server: FakeServer) -> None:
    transport = httpx.HTTPTransport()
    with Client(server.url, server.admin_key, transport=transport) as client:
        parent = client.sandboxes.create()
        children = parent.fork(1)
        assert children[0]._http is parent._http
        for sbx in (*children, parent):
            sbx.kill()
    with Sandbox.create(api_url=server.url, api_key=server.admin_key) as owner:
        (child,) = owner.fork()
    assert child._http is owner._http  # the process's pool for the server (_shared_http)
    assert child.exec("true").exit_code == 0  # still usable after the parent's block ended
    child.kill()
    child.close()
