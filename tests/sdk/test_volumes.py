"""`client.volumes`, `Sandbox.create(volumes=...)` and `VolumeInUseError` over a fake API, both
twins: the requests they send and what they make of the answers."""

from __future__ import annotations

from typing import Any

import pytest

from pandastack import VolumeInUseError as TopLevelVolumeInUseError
from pandastack.sdk import (
    AsyncClient,
    AsyncSandbox,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
    VolumeInfo,
    VolumeInUseError,
    VolumeMount,
)
from tests.sdk.fakes import API_KEY, API_URL, SANDBOX, FakeAPI, body, envelope, reply

VOLUME: dict[str, Any] = {"id": "vol-000000000001", "name": "data", "size_mb": 1024,
                          "created_at": 1000.0, "attachments": []}
ATTACHED = {**SANDBOX, "volumes": [{"id": "vol-000000000001", "name": "data",
                                    "mount_path": "/data", "read_only": False}]}
SNAPSHOT: dict[str, Any] = {"id": "vsnap-000000000001", "volume_name": "data",
                            "volume_id": "vol-000000000001", "size_mb": 1024,
                            "stored_bytes": 4096, "created_at": 1000.0}
IN_USE = envelope("volume_in_use", "volume 'data' is attached to sbx-1")


def fake() -> FakeAPI:
    return (FakeAPI()
            .on("POST", "/v1/volumes", reply(201, VOLUME))
            .on("GET", "/v1/volumes", reply(200, {"volumes": [VOLUME]}))
            .on("GET", "/v1/volumes/data", reply(200, VOLUME))
            .on("DELETE", "/v1/volumes/data", reply(409, IN_USE))
            .on("POST", "/v1/volumes/data/resize", reply(200, {**VOLUME, "size_mb": 2048}))
            .on("POST", "/v1/volumes/data/snapshots", reply(201, SNAPSHOT))
            .on("GET", "/v1/volume-snapshots", reply(200, {"snapshots": [SNAPSHOT]}))
            .on("DELETE", "/v1/volume-snapshots/vsnap-000000000001", reply(204))
            .on("POST", "/v1/volumes/data/move", reply(200, {**VOLUME, "host_id": "h-2"}))
            .on("POST", "/v1/sandboxes", reply(201, ATTACHED))
            .on("DELETE", "/v1/sandboxes/sb-1", reply(204)))


def test_sync_volumes_and_mounts() -> None:
    api = fake()
    with Client(API_URL, API_KEY, transport=api.transport) as c:
        made = c.volumes.create("data")
        assert isinstance(made, VolumeInfo) and made.id == "vol-000000000001"
        # The size is the server's default (1024), or a snapshot's.
        assert body(api.last("POST", "/v1/volumes")) == {"name": "data"}
        c.volumes.create("data", from_snapshot="vsnap-000000000001")
        assert body(api.last("POST", "/v1/volumes")) == {"name": "data",
                                                         "from_snapshot": "vsnap-000000000001"}
        snap = c.volumes.snapshot("data")
        assert (snap.id, snap.volume_name, snap.stored_bytes) == (
            "vsnap-000000000001", "data", 4096)
        assert [s.id for s in c.volumes.snapshots("data")] == ["vsnap-000000000001"]
        assert api.last("GET", "/v1/volume-snapshots").url.params["volume"] == "data"
        c.volumes.delete_snapshot("vsnap-000000000001")
        assert c.volumes.move("data", "h-2", team="t").host_id == "h-2"
        assert body(api.last("POST", "/v1/volumes/data/move")) == {"host_id": "h-2",
                                                                   "team": "t"}
        c.volumes.create("data", size_mb=64)
        assert body(api.last("POST", "/v1/volumes")) == {"name": "data", "size_mb": 64}
        assert [v.name for v in c.volumes.list()] == ["data"]
        assert c.volumes.get("data").size_mb == 1024
        assert c.volumes.resize("data", 2048).size_mb == 2048
        assert body(api.last("POST", "/v1/volumes/data/resize")) == {"size_mb": 2048}
        with pytest.raises(VolumeInUseError) as err:
            c.volumes.delete("data")
        assert isinstance(err.value, ConflictError) and err.value.code == "volume_in_use"
        assert err.value.status == 409 and err.value.request_id == "req-123"
        with pytest.raises(NotFoundError):
            c.volumes.get("other")  # the fake has no such route: 404
        sbx = c.sandboxes.create(volumes=[{"name": "data", "mount_path": "/data"},
                                          VolumeMount(name="ref", mount_path="/ref",
                                                      read_only=True)])
        assert body(api.last("POST", "/v1/sandboxes"))["volumes"] == [
            {"name": "data", "mount_path": "/data"},
            {"name": "ref", "mount_path": "/ref", "read_only": True}]
        assert [(v.name, v.mount_path, v.read_only) for v in sbx.info.volumes] == [
            ("data", "/data", False)]
    sent = len(api.requests)
    for bad in ([{"name": "Data", "mount_path": "/data"}], [{"name": "data"}],
                [{"name": "data", "mount_path": "relative"}]):
        with pytest.raises(InvalidRequestError):
            Sandbox.create(volumes=bad, api_url=API_URL, api_key=API_KEY,
                           transport=api.transport)
    with Client(API_URL, API_KEY, transport=api.transport) as c, \
            pytest.raises(InvalidRequestError):
        c.volumes.create("data", size_mb=1)
    assert len(api.requests) == sent  # refused before anything was sent
    assert TopLevelVolumeInUseError is VolumeInUseError


async def test_async_volumes_and_mounts() -> None:
    api = fake()
    async with AsyncClient(API_URL, API_KEY, transport=api.transport) as c:
        assert (await c.volumes.create("data", size_mb=64)).name == "data"
        assert body(api.last("POST", "/v1/volumes")) == {"name": "data", "size_mb": 64}
        assert [v.id for v in await c.volumes.list()] == ["vol-000000000001"]
        assert (await c.volumes.get("data")).attachments == []
        assert (await c.volumes.resize("data", 2048)).size_mb == 2048
        assert (await c.volumes.snapshot("data")).size_mb == 1024
        assert len(await c.volumes.snapshots()) == 1
        await c.volumes.delete_snapshot("vsnap-000000000001")
        assert (await c.volumes.move("data", "h-2")).host_id == "h-2"
        assert body(api.last("POST", "/v1/volumes/data/move")) == {"host_id": "h-2"}
        with pytest.raises(VolumeInUseError):
            await c.volumes.delete("data")
    sbx = await AsyncSandbox.create(volumes=[{"name": "data", "mount_path": "/data",
                                              "read_only": False}],
                                    api_url=API_URL, api_key=API_KEY, transport=api.transport)
    try:
        assert body(api.last("POST", "/v1/sandboxes"))["volumes"] == [
            {"name": "data", "mount_path": "/data", "read_only": False}]
        assert sbx.info.volumes[0].id == "vol-000000000001"
    finally:
        await sbx.kill()
        await sbx.close()
