"""Volume backups (`volumes.snapshot`) and volume moves between hosts, mixed into `Store`.

A backup's stored bytes are metered as snapshot storage (its segment opens with the row and
closes when it is deleted). A move is recorded on the volume's row in two steps so that a
server that stops in the middle knows what to undo or finish (server/volumes/snapshots.py):
`moving_to` while the copy is made (attaching, resizing and deleting the volume are refused
meanwhile), then `host_id` switched and `moving_from` kept until the old copy is gone."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from .models import UsageSegment, Volume, VolumeAttachment, VolumeBackup
from .usage import GIB, QuotaCheck, close_segments


class MoveRefused(Exception):
    """The volume is attached, moving already, or gone (the API's 409 or 404)."""


class VolumeBackupStore:
    """Mixed into `Store`."""

    if TYPE_CHECKING:
        def session(self) -> AbstractContextManager[Session]: ...

        def team_locked(self, team: str) -> AbstractContextManager[Session]: ...

    def add_volume_backup(self, row: VolumeBackup,
                          check: QuotaCheck | None = None) -> VolumeBackup:
        """Record a backup the host made, after `check` (the team's max_snapshot_gb with
        its size) passed under the team's lock, atomically with it."""
        with self.team_locked(row.team) as s:
            if check is not None:
                check(s, row.team)
            s.add(row)
            s.flush()
            s.execute(insert(UsageSegment).values(
                team=row.team, kind="snapshot", subject_id=row.id, sandbox_id=None,
                template=None, vcpus=0, memory_mb=0, gib=row.stored_bytes / GIB,
                started_at=row.created_at, ended_at=None))
        return row

    def get_volume_backup(self, team: str, backup_id: str) -> VolumeBackup | None:
        with self.session() as s:
            return s.scalars(select(VolumeBackup).where(
                VolumeBackup.id == backup_id, VolumeBackup.team == team,
                VolumeBackup.deleted_at.is_(None))).first()

    def list_volume_backups(self, team: str, volume_name: str | None = None
                            ) -> list[VolumeBackup]:
        with self.session() as s:
            query = select(VolumeBackup).where(VolumeBackup.team == team,
                                               VolumeBackup.deleted_at.is_(None))
            if volume_name is not None:
                query = query.where(VolumeBackup.volume_name == volume_name)
            return list(s.scalars(query.order_by(VolumeBackup.created_at, VolumeBackup.id)))

    def mark_volume_backup_deleted(self, backup_id: str, at: float | None = None) -> None:
        at = time.time() if at is None else at
        with self.session() as s:
            s.execute(update(VolumeBackup).where(VolumeBackup.id == backup_id,
                                                 VolumeBackup.deleted_at.is_(None))
                      .values(deleted_at=at))
            close_segments(s, [backup_id], ["snapshot"], at)

    # -- moves ----------------------------------------------------------------------------

    def begin_volume_move(self, volume_id: str, target: str) -> Volume:
        """Mark the live, detached volume as moving to host `target` (MoveRefused)."""
        with self.session() as s:
            row = s.get(Volume, volume_id, with_for_update=True)
            if row is None or row.deleted_at is not None:
                raise MoveRefused("gone")
            if row.moving_to is not None or row.moving_from is not None:
                raise MoveRefused(f"volume {row.name!r} is being moved already")
            held = s.scalars(select(VolumeAttachment.sandbox_id).where(
                VolumeAttachment.volume_id == volume_id)).first()
            if held is not None:
                raise MoveRefused(f"volume {row.name!r} is attached to {held}: cannot move "
                                  "it until that sandbox ends")
            row.moving_to = target
            return row

    def switch_volume_host(self, volume_id: str) -> None:
        """The copy on `moving_to` is made: the volume lives there from now on."""
        with self.session() as s:
            row = s.get(Volume, volume_id, with_for_update=True)
            if row is None or row.moving_to is None:
                return
            row.moving_from, row.host_id, row.moving_to = row.host_id, row.moving_to, None

    def end_volume_move(self, volume_id: str, *, undone: bool = False) -> None:
        """The move is over (`undone`: it was rolled back before the switch)."""
        with self.session() as s:
            values = {"moving_to": None} if undone else {"moving_from": None}
            s.execute(update(Volume).where(Volume.id == volume_id).values(**values))

    def unfinished_volume_moves(self) -> list[Volume]:
        with self.session() as s:
            return list(s.scalars(select(Volume).where(
                (Volume.moving_to.is_not(None)) | (Volume.moving_from.is_not(None)))))


__all__ = ["MoveRefused", "VolumeBackupStore"]
