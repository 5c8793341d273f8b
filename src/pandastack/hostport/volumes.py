"""Durable volumes through the host port (ADR 0027): a host keeps each volume's image; the
control plane keeps names, teams and who has one mounted, and asks the host that holds a
volume for everything done to it.

A volume is mounted when a sandbox is created (`RuntimePort.create(volumes=...)`): QEMU's
microvm has no hot-plug, so every VM has `MAX_VOLUMES_PER_SANDBOX` slots and a restore backs
them. A fork's child, or a sandbox made from a snapshot, gets a copy of each read-write
volume as it was at that instant, under `rules.clone_volume_id(volume, child)`; read-only
volumes are shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


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
    host_id: str | None = None


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
