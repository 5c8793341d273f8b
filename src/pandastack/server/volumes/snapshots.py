"""Portable volumes (ADR 0027, "Portable volumes"): volume snapshots in the object store the
hosts share, new volumes made of them on any host, and moves of a volume between hosts.

A volume snapshot (`POST /v1/volumes/{name}/snapshots`) is taken by the volume's host while
no sandbox writes to it (409 `volume_in_use` while one has it mounted read-write; readers
may stay). It belongs to the team, outlives the volume, and its stored bytes are metered as
snapshot storage. `POST /v1/volumes {"from_snapshot": ...}` makes a new volume of it on
whichever host takes it (or the admin's `host_id`).

A move (`POST /v1/volumes/{name}/move`, admin only, a detached volume) is a backup on the
old host under an id derived from the volume and the target (`move_backup_id`), a restore
under the same volume id on the target, the row's host switched, then the old copy and the
backup deleted. The row records each step (store/volume_backups.py); a server that stops
in the middle undoes a move that had not switched (the target's copy goes) and finishes one
that had (the old copy goes), when it starts again (`finish_moves`)."""

from __future__ import annotations

import hashlib
import logging
from contextlib import suppress
from dataclasses import replace
from typing import TYPE_CHECKING

from pandastack.hostport.errors import HostError, HostExhausted, VolumeNotFound
from pandastack.hostport.volumes import HostVolume, VolumePort
from pandastack.rules import VOLUME_BACKUP_ID_PREFIX, VOLUME_BACKUP_ID_RE, new_volume_backup_id
from pandastack.wire.resources import CreateVolume, VolumeSnapshotInfo

from ..hosts.pinning import pinned_host
from ..store import Volume, VolumeBackup
from ..store.volume_backups import MoveRefused
from ..web.errors import ApiError, api_error_of, host_call, not_found

if TYPE_CHECKING:
    from .service import VolumeService

log = logging.getLogger("pandastack.server")


def move_backup_id(volume_id: str, host_id: str) -> str:
    """The backup a move of `volume_id` to `host_id` goes through: derived, so that a
    server finishing the move after a restart knows which one to delete."""
    digest = hashlib.sha256(f"move/{volume_id}/{host_id}".encode()).hexdigest()
    return VOLUME_BACKUP_ID_PREFIX + digest[:12]


def snapshot_info(row: VolumeBackup) -> VolumeSnapshotInfo:
    return VolumeSnapshotInfo(id=row.id, volume_name=row.volume_name, volume_id=row.volume_id,
                              size_mb=row.size_mb, stored_bytes=row.stored_bytes,
                              created_at=row.created_at)


class VolumeSnapshots:
    def __init__(self, volumes: VolumeService) -> None:
        self.volumes = volumes
        self.store = volumes.store

    def row(self, team: str, snapshot_id: str) -> VolumeBackup:
        row = (self.store.get_volume_backup(team, snapshot_id)
               if VOLUME_BACKUP_ID_RE.match(snapshot_id) else None)
        if row is None:
            raise not_found(f"volume snapshot {snapshot_id!r}")
        return row

    async def take(self, team: str, name: str) -> VolumeBackup:
        """A snapshot of the team's volume `name` (409 while it has a writer)."""
        volume = self.volumes.row(team, name)
        if volume.moving_to is not None:
            raise ApiError(409, "volume_in_use", f"volume {name!r} is being moved")
        writers = [a.sandbox_id for a in self.store.volume_attachments([volume.id])[volume.id]
                   if not a.read_only]
        if writers:
            raise ApiError(409, "volume_in_use", f"volume {name!r} is mounted read-write by "
                           f"{writers[0]}: snapshot it once that sandbox has ended (or "
                           "snapshot the sandbox, which copies its volumes)")
        backup_id = new_volume_backup_id()
        quotas = self.volumes.quotas
        # Its size is known once it is made: refused before when no room is left, and
        # admitted with its size (else the backup goes again).
        self.store.check_quota(team, quotas.snapshot_room(0))
        with self.volumes.pinned(volume.host_id):
            made = await host_call(self.volumes.port.backup_volume(volume.id, backup_id))
        row = VolumeBackup(
            id=backup_id, team=team, volume_id=volume.id, volume_name=volume.name,
            size_mb=made.size_mb, stored_bytes=made.stored_bytes, created_at=made.created_at,
            deleted_at=None)
        try:
            return self.store.add_volume_backup(row, quotas.snapshot_room(made.stored_bytes))
        except BaseException:
            with self.volumes.pinned(volume.host_id), suppress(HostError):
                await self.volumes.port.delete_volume_backup(backup_id)
            raise

    async def delete(self, team: str, snapshot_id: str) -> None:
        row = self.row(team, snapshot_id)
        await host_call(self.volumes.port.delete_volume_backup(row.id))
        self.store.mark_volume_backup_deleted(row.id)

    async def restore(self, team: str, req: CreateVolume) -> Volume:
        """A new volume `req.name` holding snapshot `req.from_snapshot` (grown to
        `req.size_mb` if that is larger; 422 if smaller)."""
        assert req.from_snapshot is not None
        snap = self.row(team, req.from_snapshot)
        size_mb = snap.size_mb if req.size_mb is None else req.size_mb
        if size_mb < snap.size_mb:
            raise ApiError(422, "validation_error", f"size_mb: snapshot {snap.id} holds "
                           f"{snap.size_mb} MiB; a volume made of it is at least that large")

        async def build(port: VolumePort, volume_id: str) -> HostVolume:
            made = await port.restore_volume(snap.id, volume_id)
            if size_mb > snap.size_mb:
                with self.volumes.pinned(made.host_id):
                    grown = await port.resize_volume(volume_id, size_mb)
                made = replace(grown, host_id=made.host_id)
            return made
        return await self.volumes.make(team, req.name, size_mb, snap.volume_id, build)

    # -- moves ----------------------------------------------------------------------------

    async def move(self, team: str, name: str, host_id: str) -> Volume:
        """Move the team's detached volume to host `host_id` (it keeps its id and name)."""
        volume = self.volumes.row(team, name)
        if volume.host_id == host_id:
            return volume
        if volume.host_id is None:
            raise ApiError(422, "validation_error", "host_id: this server drives one host "
                           "(there is no other host to move the volume to)")
        try:
            self.store.begin_volume_move(volume.id, host_id)
        except MoveRefused as exc:
            if str(exc) == "gone":
                raise not_found(f"volume {name!r}") from None
            raise ApiError(409, "volume_in_use", str(exc)) from None
        source = volume.host_id
        try:
            await self._copy(volume.id, source, host_id)
        except BaseException as exc:
            await self._undo(volume.id, source, host_id)
            if isinstance(exc, HostExhausted):
                raise ApiError(422, "validation_error", f"host_id: {exc}") from None
            api = api_error_of(exc) if isinstance(exc, Exception) else None
            if api is not None:
                raise api from None
            raise
        self.store.switch_volume_host(volume.id)
        await self._drop_source(volume.id, source, host_id)
        volume.host_id = host_id
        return volume

    async def _copy(self, volume_id: str, source: str, target: str) -> None:
        backup_id = move_backup_id(volume_id, target)
        port = self.volumes.port
        with self.volumes.pinned(source):
            await port.backup_volume(volume_id, backup_id)
        with self.volumes.pinned(target):
            await port.restore_volume(backup_id, volume_id)

    async def _undo(self, volume_id: str, source: str, target: str) -> None:
        """The move stopped before the switch: the target's copy and the backup go (best
        effort: what stays is retried at the next start), the volume stays where it was."""
        port = self.volumes.port
        try:
            with self.volumes.pinned(target), suppress(VolumeNotFound):
                await port.delete_volume(volume_id)
            with self.volumes.pinned(source):
                await port.delete_volume_backup(move_backup_id(volume_id, target))
        except Exception as exc:
            log.warning("volume %s: undoing its move to %s left something (%s); the next "
                        "start retries", volume_id, target, exc)
            return
        self.store.end_volume_move(volume_id, undone=True)

    async def _drop_source(self, volume_id: str, source: str, target: str) -> None:
        """After the switch: the old copy and the backup go."""
        port = self.volumes.port
        try:
            with self.volumes.pinned(source):
                with suppress(VolumeNotFound):
                    await port.delete_volume(volume_id)
                await port.delete_volume_backup(move_backup_id(volume_id, target))
        except Exception as exc:
            log.warning("volume %s moved to %s, but its copy on %s was not deleted (%s); the "
                        "next start retries", volume_id, target, source, exc)
            return
        self.store.end_volume_move(volume_id)

    async def finish_moves(self) -> None:
        """At start: undo each move that had not switched hosts, finish each that had."""
        for row in self.store.unfinished_volume_moves():
            if pinned_host.get() is not None:
                break  # never under a caller's pin
            if row.moving_to is not None and row.host_id is not None:
                await self._undo(row.id, row.host_id, row.moving_to)
            elif row.moving_from is not None and row.host_id is not None:
                await self._drop_source(row.id, row.moving_from, row.host_id)
            else:
                self.store.end_volume_move(row.id, undone=row.moving_to is not None)
