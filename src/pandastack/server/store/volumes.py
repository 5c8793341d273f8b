"""Volumes and their attachments, mixed into `Store`.

One writer: a read-write attachment needs a volume with no attachment at all, a read-only one
a volume with no read-write attachment. The check and the insert of the attachments run in
the transaction that inserts the sandbox's row (`attach` inside `Store.admit`'s check), with
the volume rows locked (SELECT ... FOR UPDATE on PostgreSQL; SQLite serialises writers), so
two racing creates cannot both get the writer. A sandbox that ends loses its attachments in
the transaction that ends it (`detach_sandboxes`); a hibernated one keeps them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from .models import UsageSegment, Volume, VolumeAttachment
from .usage import QuotaCheck, close_volume_segment, open_volume_segment


class VolumeConflict(Exception):
    """The attach would break the one-writer rule (the API's 409 volume_in_use)."""


class VolumeGone(Exception):
    """A volume the attach names was deleted meanwhile (the API's 404)."""


@dataclass(frozen=True)
class PlannedAttach:
    """One attachment a new sandbox gets: of an existing volume (`clone` None), or of a new
    volume row `clone` (a fork child's or a snapshot restore's copy), inserted with it."""

    volume_id: str
    mount_path: str
    read_only: bool
    clone: Volume | None = None


def detach_sandboxes(s: Session, sandbox_ids: Sequence[str]) -> None:
    """The sandboxes ended: their attachments go, in `s`'s transaction."""
    if sandbox_ids:
        s.execute(delete(VolumeAttachment).where(
            VolumeAttachment.sandbox_id.in_(list(sandbox_ids))))


def attach(s: Session, sandbox_id: str, plan: Sequence[PlannedAttach], at: float) -> None:
    """Check the one-writer rule for `plan` and insert its attachments (and clone rows), in
    `s`'s transaction. VolumeGone, VolumeConflict."""
    existing = sorted({p.volume_id for p in plan if p.clone is None})
    if existing:
        live = {vid: moving for vid, moving in s.execute(
            select(Volume.id, Volume.moving_to).where(
                Volume.id.in_(existing), Volume.deleted_at.is_(None))
            .order_by(Volume.id).with_for_update()).all()}
        gone = [v for v in existing if v not in live]
        if gone:
            raise VolumeGone(", ".join(gone))
        moving = [v for v in existing if live[v] is not None]
        if moving:
            raise VolumeConflict(f"volume {moving[0]} is being moved to another host")
        held = list(s.scalars(select(VolumeAttachment).where(
            VolumeAttachment.volume_id.in_(existing))))
        for p in plan:
            if p.clone is not None:
                continue
            mine = [a for a in held if a.volume_id == p.volume_id]
            writer = next((a for a in mine if not a.read_only), None)
            if writer is not None:
                raise VolumeConflict(f"volume {p.volume_id} is mounted read-write by "
                                     f"sandbox {writer.sandbox_id}")
            if not p.read_only and mine:
                raise VolumeConflict(f"volume {p.volume_id} is mounted read-only by sandbox "
                                     f"{mine[0].sandbox_id}: a writer needs it to itself")
    for p in plan:
        if p.clone is not None:
            s.add(p.clone)
            s.flush()
            open_volume_segment(s, p.clone.team, p.clone.id, p.clone.size_mb, at)
        s.add(VolumeAttachment(volume_id=p.volume_id, sandbox_id=sandbox_id,
                               mount_path=p.mount_path, read_only=p.read_only))
    s.flush()


def attaching(check: QuotaCheck | None,
              plans: Sequence[tuple[str, Sequence[PlannedAttach]]],
              at: float | None = None) -> QuotaCheck | None:
    """`check`, then the attachments of `plans` ((sandbox id, plan) each): what `admit` runs
    in the transaction that inserts the sandboxes' rows."""
    if not any(plan for _, plan in plans):
        return check

    def run(s: Session, team: str) -> None:
        if check is not None:
            check(s, team)
        now = time.time() if at is None else at
        for sandbox_id, plan in plans:
            attach(s, sandbox_id, plan, now)

    return run


class VolumeStore:
    """Mixed into `Store`."""

    if TYPE_CHECKING:
        def session(self) -> AbstractContextManager[Session]: ...

        def team_locked(self, team: str) -> AbstractContextManager[Session]: ...

    def add_volume(self, row: Volume, check: QuotaCheck | None = None) -> Volume:
        """Insert a new volume row after `check` (its quota) passed, atomically with it, and
        open its usage segment. IntegrityError if the team has a live volume of that name."""
        with self.team_locked(row.team) as s:
            if check is not None:
                check(s, row.team)
            s.add(row)
            s.flush()
            open_volume_segment(s, row.team, row.id, row.size_mb, row.created_at)
        return row

    def forget_volume(self, volume_id: str) -> None:
        """A volume whose host never made it: its row and usage go as if it never was."""
        with self.session() as s:
            s.execute(delete(UsageSegment).where(UsageSegment.subject_id == volume_id,
                                                 UsageSegment.kind == "volume"))
            s.execute(delete(VolumeAttachment).where(VolumeAttachment.volume_id == volume_id))
            s.execute(delete(Volume).where(Volume.id == volume_id))

    def set_volume_host(self, volume_id: str, host_id: str | None) -> None:
        with self.session() as s:
            s.execute(update(Volume).where(Volume.id == volume_id).values(host_id=host_id))

    def get_volume(self, team: str, name: str) -> Volume | None:
        """The team's live volume of that name."""
        with self.session() as s:
            return s.scalars(select(Volume).where(Volume.team == team, Volume.name == name,
                                                  Volume.deleted_at.is_(None))).first()

    def volumes_by_id(self, team: str, ids: Iterable[str]) -> dict[str, Volume]:
        """The team's live volumes among `ids`."""
        wanted = list(ids)
        if not wanted:
            return {}
        with self.session() as s:
            return {v.id: v for v in s.scalars(select(Volume).where(
                Volume.team == team, Volume.id.in_(wanted), Volume.deleted_at.is_(None)))}

    def list_volumes(self, team: str) -> list[Volume]:
        with self.session() as s:
            return list(s.scalars(select(Volume).where(Volume.team == team,
                                                       Volume.deleted_at.is_(None))
                                  .order_by(Volume.created_at, Volume.name)))

    def volume_attachments(self, volume_ids: Iterable[str]) -> dict[str, list[VolumeAttachment]]:
        wanted = list(volume_ids)
        out: dict[str, list[VolumeAttachment]] = {v: [] for v in wanted}
        if not wanted:
            return out
        with self.session() as s:
            for a in s.scalars(select(VolumeAttachment).where(
                    VolumeAttachment.volume_id.in_(wanted))
                    .order_by(VolumeAttachment.sandbox_id)):
                out[a.volume_id].append(a)
        return out

    def sandbox_attachments(
            self, sandbox_ids: Iterable[str]) -> dict[str, list[tuple[VolumeAttachment, Volume]]]:
        """Each sandbox's attachments with their volumes, in mount-path order."""
        wanted = list(sandbox_ids)
        out: dict[str, list[tuple[VolumeAttachment, Volume]]] = {}
        if not wanted:
            return out
        with self.session() as s:
            for chunk in range(0, len(wanted), 500):  # bound the statement's parameters
                rows = s.execute(select(VolumeAttachment, Volume)
                                 .join(Volume, Volume.id == VolumeAttachment.volume_id)
                                 .where(VolumeAttachment.sandbox_id.in_(
                                     wanted[chunk:chunk + 500]))
                                 .order_by(VolumeAttachment.mount_path)).all()
                for a, v in rows:
                    out.setdefault(a.sandbox_id, []).append((a, v))
        return out

    def resize_volume_row(self, volume_id: str, size_mb: int, at: float | None = None,
                          reserved_mb: int = 0) -> None:
        """Record a new size: the old size's segment closes and the new one's opens, and the
        resize's reservation (`reserve_volume`) goes in the same transaction."""
        at = time.time() if at is None else at
        with self.session() as s:
            row = s.get(Volume, volume_id, with_for_update=True)
            if row is None or row.deleted_at is not None:
                return
            row.size_mb = size_mb
            if reserved_mb:
                row.reserved_mb = max(0, row.reserved_mb - reserved_mb)
            close_volume_segment(s, volume_id, at)
            open_volume_segment(s, row.team, volume_id, size_mb, at)

    def mark_volume_deleted(self, volume_id: str, at: float | None = None) -> None:
        at = time.time() if at is None else at
        with self.session() as s:
            s.execute(update(Volume).where(Volume.id == volume_id, Volume.deleted_at.is_(None))
                      .values(deleted_at=at))
            close_volume_segment(s, volume_id, at)


__all__ = ["PlannedAttach", "VolumeConflict", "VolumeGone", "VolumeStore", "attach",
           "attaching", "detach_sandboxes"]
