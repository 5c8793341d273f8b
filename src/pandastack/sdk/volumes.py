"""`client.volumes` of both twins: the team's volumes (create, list, get, delete, resize,
snapshot, move) and the calls they send. Mount one with `Sandbox.create(volumes=[{"name":
..., "mount_path": ...}])`: one sandbox may mount a volume read-write at a time (else
`VolumeInUseError`), any number read-only.

    with Client() as client:
        client.volumes.create("data", size_mb=1024)
        with Sandbox.create(volumes=[{"name": "data", "mount_path": "/data"}]) as sbx:
            sbx.files.write("/data/notes.txt", "kept after the sandbox ends")
        snap = client.volumes.snapshot("data")  # into the object store the hosts share
        client.volumes.create("data-copy", from_snapshot=snap.id)  # on any host
"""

from __future__ import annotations

import builtins

from pandastack.sdk import _base
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk.models import VolumeInfo, VolumeSnapshotInfo
from pandastack.wire import resources as wire

__all__ = ["AsyncVolumes", "Volumes"]


def _path(name: str, *rest: str) -> str:
    return "/".join(("/v1/volumes", _base.path_segment(name), *rest))


def create_volume_call(name: str, size_mb: int | None, host_id: str | None,
                       from_snapshot: str | None = None) -> _base.Call[VolumeInfo]:
    body = _base.encode(wire.CreateVolume, name=name, size_mb=size_mb, host_id=host_id,
                        from_snapshot=from_snapshot)
    return _base.Call("POST", "/v1/volumes", _base.model_decoder(VolumeInfo), json=body)


def list_volumes_call() -> _base.Call[list[VolumeInfo]]:
    return _base.Call("GET", "/v1/volumes",
                      _base.list_decoder(wire.VolumeList, "volumes", VolumeInfo))


def get_volume_call(name: str) -> _base.Call[VolumeInfo]:
    return _base.Call("GET", _path(name), _base.model_decoder(VolumeInfo))


def delete_volume_call(name: str) -> _base.Call[None]:
    return _base.Call("DELETE", _path(name), _base.ignore_body)


def resize_volume_call(name: str, size_mb: int) -> _base.Call[VolumeInfo]:
    return _base.Call("POST", _path(name, "resize"), _base.model_decoder(VolumeInfo),
                      json=_base.encode(wire.ResizeVolume, size_mb=size_mb))


def snapshot_volume_call(name: str) -> _base.Call[VolumeSnapshotInfo]:
    return _base.Call("POST", _path(name, "snapshots"), _base.model_decoder(VolumeSnapshotInfo))


def _snapshot_path(snapshot_id: str) -> str:
    return "/v1/volume-snapshots/" + _base.path_segment(snapshot_id)


def list_volume_snapshots_call(name: str | None) -> _base.Call[list[VolumeSnapshotInfo]]:
    return _base.Call("GET", "/v1/volume-snapshots",
                      _base.list_decoder(wire.VolumeSnapshotList, "snapshots",
                                         VolumeSnapshotInfo),
                      params=None if name is None else {"volume": name})


def get_volume_snapshot_call(snapshot_id: str) -> _base.Call[VolumeSnapshotInfo]:
    return _base.Call("GET", _snapshot_path(snapshot_id),
                      _base.model_decoder(VolumeSnapshotInfo))


def delete_volume_snapshot_call(snapshot_id: str) -> _base.Call[None]:
    return _base.Call("DELETE", _snapshot_path(snapshot_id), _base.ignore_body)


def move_volume_call(name: str, host_id: str, team: str | None) -> _base.Call[VolumeInfo]:
    return _base.Call("POST", _path(name, "move"), _base.model_decoder(VolumeInfo),
                      json=_base.encode(wire.MoveVolume, host_id=host_id, team=team))


class Volumes(_base.ClientBase[HTTP]):
    """`client.volumes`: the team's volumes, by name."""

    def create(self, name: str, size_mb: int | None = None, *,
               host_id: str | None = None,
               from_snapshot: str | None = None) -> VolumeInfo:
        """A new volume of `size_mb` MiB (default 1024): empty, or holding volume snapshot
        `from_snapshot` (then at least its size; larger grows the file system).
        `ConflictError` if the team has one of that name; `QuotaExceededError` past the
        team's volume quota. `host_id`: admin keys only, where the server drives many
        hosts."""
        return self._http.run(create_volume_call(name, size_mb, host_id, from_snapshot))

    def list(self) -> builtins.list[VolumeInfo]:
        """The team's volumes, with the sandboxes that have each attached."""
        return self._http.run(list_volumes_call())

    def get(self, name: str) -> VolumeInfo:
        """The team's volume `name` (`NotFoundError` if it has none of that name)."""
        return self._http.run(get_volume_call(name))

    def delete(self, name: str) -> None:
        """Delete the volume and its data (`VolumeInUseError` while attached)."""
        self._http.run(delete_volume_call(name))

    def resize(self, name: str, size_mb: int) -> VolumeInfo:
        """Grow a detached volume to `size_mb` MiB; its file system follows
        (`VolumeInUseError` while attached, `InvalidRequestError` to shrink it)."""
        return self._http.run(resize_volume_call(name, size_mb))

    def snapshot(self, name: str) -> VolumeSnapshotInfo:
        """What the volume holds now, stored in the object store (it outlives the volume;
        `create(..., from_snapshot=)` makes a volume of it on any host). `VolumeInUseError`
        while a sandbox has it mounted read-write."""
        return self._http.run(snapshot_volume_call(name))

    def snapshots(self, name: str | None = None) -> builtins.list[VolumeSnapshotInfo]:
        """The team's volume snapshots (of the volume named `name`, with it)."""
        return self._http.run(list_volume_snapshots_call(name))

    def get_snapshot(self, snapshot_id: str) -> VolumeSnapshotInfo:
        """One volume snapshot of the team (`NotFoundError` otherwise)."""
        return self._http.run(get_volume_snapshot_call(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a volume snapshot (volumes made of it are not touched)."""
        self._http.run(delete_volume_snapshot_call(snapshot_id))

    def move(self, name: str, host_id: str, *, team: str | None = None) -> VolumeInfo:
        """Move a detached volume to host `host_id` (admin keys; `team`: the volume's team,
        default the key's). `VolumeInUseError` while attached."""
        return self._http.run(move_volume_call(name, host_id, team))


class AsyncVolumes(_base.ClientBase[AsyncHTTP]):
    """`client.volumes`: the team's volumes, by name (async)."""

    async def create(self, name: str, size_mb: int | None = None, *,
                     host_id: str | None = None,
                     from_snapshot: str | None = None) -> VolumeInfo:
        """A new volume of `size_mb` MiB (default 1024): empty, or holding volume snapshot
        `from_snapshot` (then at least its size; larger grows the file system).
        `ConflictError` if the team has one of that name; `QuotaExceededError` past the
        team's volume quota. `host_id`: admin keys only, where the server drives many
        hosts."""
        return await self._http.run(create_volume_call(name, size_mb, host_id, from_snapshot))

    async def list(self) -> builtins.list[VolumeInfo]:
        """The team's volumes, with the sandboxes that have each attached."""
        return await self._http.run(list_volumes_call())

    async def get(self, name: str) -> VolumeInfo:
        """The team's volume `name` (`NotFoundError` if it has none of that name)."""
        return await self._http.run(get_volume_call(name))

    async def delete(self, name: str) -> None:
        """Delete the volume and its data (`VolumeInUseError` while attached)."""
        await self._http.run(delete_volume_call(name))

    async def resize(self, name: str, size_mb: int) -> VolumeInfo:
        """Grow a detached volume to `size_mb` MiB; its file system follows
        (`VolumeInUseError` while attached, `InvalidRequestError` to shrink it)."""
        return await self._http.run(resize_volume_call(name, size_mb))

    async def snapshot(self, name: str) -> VolumeSnapshotInfo:
        """What the volume holds now, stored in the object store (it outlives the volume;
        `create(..., from_snapshot=)` makes a volume of it on any host). `VolumeInUseError`
        while a sandbox has it mounted read-write."""
        return await self._http.run(snapshot_volume_call(name))

    async def snapshots(self, name: str | None = None) -> builtins.list[VolumeSnapshotInfo]:
        """The team's volume snapshots (of the volume named `name`, with it)."""
        return await self._http.run(list_volume_snapshots_call(name))

    async def get_snapshot(self, snapshot_id: str) -> VolumeSnapshotInfo:
        """One volume snapshot of the team (`NotFoundError` otherwise)."""
        return await self._http.run(get_volume_snapshot_call(snapshot_id))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a volume snapshot (volumes made of it are not touched)."""
        await self._http.run(delete_volume_snapshot_call(snapshot_id))

    async def move(self, name: str, host_id: str, *, team: str | None = None) -> VolumeInfo:
        """Move a detached volume to host `host_id` (admin keys; `team`: the volume's team,
        default the key's). `VolumeInUseError` while attached."""
        return await self._http.run(move_volume_call(name, host_id, team))
