"""`client.volumes` of both twins: the team's volumes (create, list, get, delete, resize) and
the calls they send. Mount one with `Sandbox.create(volumes=[{"name": ..., "mount_path":
...}])`: one sandbox may mount a volume read-write at a time (else `VolumeInUseError`), any
number read-only.

    with Client() as client:
        client.volumes.create("data", size_mb=1024)
        with Sandbox.create(volumes=[{"name": "data", "mount_path": "/data"}]) as sbx:
            sbx.files.write("/data/notes.txt", "kept after the sandbox ends")
"""

from __future__ import annotations

import builtins

from pandastack import wire
from pandastack.sdk import _base
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk.models import VolumeInfo

__all__ = ["AsyncVolumes", "Volumes"]


def _path(name: str, *rest: str) -> str:
    return "/".join(("/v1/volumes", _base.path_segment(name), *rest))


def create_volume_call(name: str, size_mb: int | None,
                       host_id: str | None) -> _base.Call[VolumeInfo]:
    body = _base.encode(wire.CreateVolume, name=name, size_mb=size_mb, host_id=host_id)
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


class Volumes(_base.ClientBase[HTTP]):
    """`client.volumes`: the team's volumes, by name."""

    def create(self, name: str, size_mb: int = 1024, *,
               host_id: str | None = None) -> VolumeInfo:
        """A new empty volume of `size_mb` MiB (`ConflictError` if the team has one of that
        name; `QuotaExceededError` past the team's volume quota). `host_id`: admin keys only,
        where the server drives many hosts."""
        return self._http.run(create_volume_call(name, size_mb, host_id))

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


class AsyncVolumes(_base.ClientBase[AsyncHTTP]):
    """`client.volumes`: the team's volumes, by name (async)."""

    async def create(self, name: str, size_mb: int = 1024, *,
                     host_id: str | None = None) -> VolumeInfo:
        """A new empty volume of `size_mb` MiB (`ConflictError` if the team has one of that
        name; `QuotaExceededError` past the team's volume quota). `host_id`: admin keys only,
        where the server drives many hosts."""
        return await self._http.run(create_volume_call(name, size_mb, host_id))

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
