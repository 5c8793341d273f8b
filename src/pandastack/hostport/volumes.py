"""Durable volumes through the host port (ADR 0027): a host keeps each volume's image; the
control plane keeps names, teams and who has one mounted, and asks the host that holds a
volume for everything done to it.

A volume is mounted when a sandbox is created (`RuntimePort.create(volumes=...)`): QEMU's
microvm has no hot-plug, so every VM has `MAX_VOLUMES_PER_SANDBOX` slots and a restore backs
them. A fork's child, or a sandbox made from a snapshot, gets a copy of each read-write
volume as it was at that instant, under `rules.clone_volume_id(volume, child)`; read-only
volumes are shared.

A volume backup (`backup_volume`) is the image of a volume without a writer, in the object
store that the hosts share, under `volumes/<backup id>.json`; any host of that store can
make a new volume of it (`restore_volume`). A move to another host is a backup, a restore
there and a delete here, driven by the control plane.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Protocol, runtime_checkable

from pydantic import Field


@dataclass(frozen=True)
class VolumeMountRequest:
    """Mount volume `volume_id` (held by the host) at `mount_path` in a new sandbox."""

    volume_id: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True)
class HostVolume:
    """A volume as its host sees it. `attached_to`: the sandboxes of this host that have
    it mounted; `host_id`: filled in by a pool of hosts."""

    id: str
    size_mb: int
    created_at: float
    source: str | None = None
    attached_to: tuple[str, ...] = field(default_factory=tuple)
    # Not sent by the host API: a host does not know it, and older clients refuse fields
    # they do not know.
    host_id: Annotated[str | None, Field(exclude=True)] = None


@dataclass(frozen=True)
class VolumeBackup:
    """A volume's image as the object store keeps it. `stored_bytes`: what its data takes
    (holes are not stored; chunks the store had already are not stored again)."""

    id: str
    volume_id: str
    size_mb: int
    stored_bytes: int
    created_at: float


@runtime_checkable
class VolumePort(Protocol):
    """Volume files on a host. A pool routes each call to the host pinned by the request's
    context (`server.hosts.pinning`), which the control plane sets to the volume's host; a
    create without a pin goes to a host of its choice (reported in `host_id`)."""

    async def create_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        """A new empty ext4 volume. ValueError for a size out of bounds."""
        ...

    async def get_volume(self, volume_id: str) -> HostVolume:
        """VolumeNotFound if the host has no such volume."""
        ...

    async def list_volumes(self) -> Sequence[HostVolume]: ...

    async def resize_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        """Grow a detached volume and its file system (VolumeInUse while mounted,
        ValueError to shrink it)."""
        ...

    async def delete_volume(self, volume_id: str) -> None:
        """VolumeInUse while mounted, VolumeNotFound if there is none."""
        ...

    async def backup_volume(self, volume_id: str, backup_id: str) -> VolumeBackup:
        """Store the volume's image in the object store as backup `backup_id`: VolumeInUse
        while a sandbox has it mounted read-write, SetupError where the host has no object
        store."""
        ...

    async def restore_volume(self, backup_id: str, volume_id: str) -> HostVolume:
        """A new volume `volume_id` holding backup `backup_id` (VolumeNotFound if the store
        has no such backup; VolumeInUse if the host has a volume of that id)."""
        ...

    async def delete_volume_backup(self, backup_id: str) -> None:
        """Forget the backup (its chunks go with the store's garbage collection); nothing
        if there is none."""
        ...
