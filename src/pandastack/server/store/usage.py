"""Usage segments and team quotas, mixed into `Store`.

A segment is one interval over which a team held one resource. Every writer of a sandbox's
state calls `meter_state_change` in the transaction that writes the state, with the time of
that write: the interval and the state change commit together or not at all, so a restart of
the server between them cannot lose one or count one twice (an open segment of a sandbox
that is still running after a restart is simply still open). A sandbox's compute segment
(vCPUs, memory) is open while it is running or paused; its disk segment from running until
it ends (hibernated included: its disk is still kept). Snapshots hold their stored bytes
from their row's insert to their deletion; volumes from their creation to their deletion
(`open_volume_segment` / `close_volume_segment`, called in the volume code's transactions).

Quota checks run in `admit`: one transaction that takes the team's write lock (SELECT ...
FOR UPDATE of its `teams` row on PostgreSQL; BEGIN IMMEDIATE on SQLite, whose writers are
serialised by the database), checks, and inserts the rows, so two racing creates of a team
cannot both pass. What grows an existing row (a wake, restart or restore of a sandbox, a
hibernate, a volume's resize) reserves the same way before its host call: `reserve` sets the
row's `quota_hold` (`reserve_volume` its `reserved_mb`) in the check's transaction, the
counts below include it, and the caller releases it when the call has landed or failed; the
lock is never held across the host call (ADR 0025, addendum)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from .models import Sandbox, Snapshot, Team, TeamQuota, TemplateVersion, UsageSegment, Volume

# Core statements on the table, not ORM ones: they run inside the create's transaction, and
# an executemany of plain rows is a fraction of an ORM INSERT's cost (~0.1 ms against ~0.8).
SEGMENTS = cast(Table, UsageSegment.__table__)
SANDBOXES = cast(Table, Sandbox.__table__)
_SANDBOX_ATTRS = [(attr.key, attr.columns[0]) for attr in inspect(Sandbox).column_attrs]
COMPUTE_STATES = frozenset({"running", "paused"})
DISK_STATES = frozenset({"running", "paused", "hibernated", "stopped"})
#: What counts against a team's concurrent-sandbox quota (a hibernated one holds no VM).
ACTIVE_STATES = ("starting", "running", "paused")
#: `Sandbox.quota_hold`: counted as a live sandbox (a wake, restart or restore under way),
#: or as a hibernated one (a hibernate under way).
HOLD_AWAKE = "awake"
HOLD_HIBERNATED = "hibernated"
#: States a hold counts in (an ended row holds nothing, whatever it was left with).
HELD_STATES = ("starting", "running", "paused", "hibernated", "stopped", "host_lost")
#: The root disk of a sandbox created without `disk_mb`: the built-in templates' rootfs
#: (host/images/build.py ROOTFS_SIZE, 2 GiB).
DEFAULT_DISK_MB = 2048
GIB = 1 << 30

#: Raises (an ApiError 429) when admitting the rows would cross the team's quota.
QuotaCheck = Callable[[Session, str], None]


def insert_values(row: Sandbox) -> dict[str, Any]:
    """`row`'s column values for a Core INSERT; an attribute left unset gets its column's
    default, on `row` too (so it reads as the ORM's flush would have left it)."""
    values: dict[str, Any] = {}
    for key, column in _SANDBOX_ATTRS:
        if key not in row.__dict__:
            default = column.default
            value = (None if default is None
                     else default.arg(None) if default.is_callable
                     else default.arg)
            setattr(row, key, value)
        values[column.key] = getattr(row, key)
    return values


def _segment(row: Sandbox, kind: str, at: float) -> dict[str, Any]:
    compute = kind == "compute"
    return {"team": row.team, "kind": kind, "subject_id": row.id, "sandbox_id": row.id,
            "template": row.template, "vcpus": row.vcpus if compute else 0,
            "memory_mb": row.memory_mb if compute else 0,
            "gib": 0.0 if compute else (row.disk_mb or DEFAULT_DISK_MB) / 1024,
            "started_at": at, "ended_at": None}


def meter_state_change(s: Session, row: Sandbox, old: str | None, at: float) -> None:
    """Open and close `row`'s segments for its move from `old` (None: a new row) to
    `row.state`, in `s`'s transaction (at most one INSERT and one UPDATE)."""
    opens: list[str] = []
    closes: list[str] = []
    for kind, states in (("compute", COMPUTE_STATES), ("disk", DISK_STATES)):
        was, now = old in states, row.state in states
        if now and not was:
            opens.append(kind)
        elif was and not now:
            closes.append(kind)
    if closes:
        close_segments(s, [row.id], closes, at)
    if opens:
        s.execute(insert(SEGMENTS), [_segment(row, kind, at) for kind in opens])


def close_segments(s: Session, subject_ids: Sequence[str], kinds: Sequence[str],
                   at: float) -> None:
    s.execute(update(SEGMENTS).where(SEGMENTS.c.subject_id.in_(list(subject_ids)),
                                     SEGMENTS.c.kind.in_(list(kinds)),
                                     SEGMENTS.c.ended_at.is_(None))
              .values(ended_at=at))


def open_snapshot_segment(s: Session, row: Snapshot, at: float) -> None:
    s.execute(insert(UsageSegment).values(
        team=row.team, kind="snapshot", subject_id=row.id, sandbox_id=row.source_sandbox,
        template=row.template, vcpus=0, memory_mb=0, gib=row.size_bytes / GIB,
        started_at=at, ended_at=None))


def open_volume_segment(s: Session, team: str, volume_id: str, size_mb: int,
                        at: float) -> None:
    """A volume of `size_mb` starts to be held (create; the second half of a resize)."""
    s.execute(insert(UsageSegment).values(
        team=team, kind="volume", subject_id=volume_id, sandbox_id=None, template=None,
        vcpus=0, memory_mb=0, gib=size_mb / 1024, started_at=at, ended_at=None))


def close_volume_segment(s: Session, volume_id: str, at: float) -> None:
    """The volume stops being held at its old size (delete; the first half of a resize)."""
    close_segments(s, [volume_id], ["volume"], at)


# Built once: every create and state change under a quota runs them.
_BEGIN_IMMEDIATE = text("BEGIN IMMEDIATE")
_TEAM_FOR_UPDATE = select(Team.id).where(Team.id == bindparam("lock_team")).with_for_update()


def lock_team(s: Session, team: str, *, exists: bool = False) -> None:
    """Take the team's write lock for the rest of `s`'s transaction; must be `s`'s first
    statement (on SQLite it begins the transaction). `exists`: the team's row is known to be
    there (team rows are never deleted), so no statement makes sure of it."""
    dialect = s.get_bind().dialect.name
    if dialect == "sqlite":
        # pysqlite would begin a deferred transaction only at the first write: the reads of
        # the check must already hold the write lock.
        s.execute(_BEGIN_IMMEDIATE)
        if exists:
            return  # BEGIN IMMEDIATE is the whole lock on SQLite
    elif dialect == "postgresql" and not exists:
        # Two first admits of a team never seen would both find no row and both INSERT it:
        # the second failed on the primary key (a 500). ON CONFLICT waits for the first's
        # transaction and then does nothing; the row lock below serializes them as usual.
        s.execute(pg_insert(Team).values(id=team, created_at=time.time())
                  .on_conflict_do_nothing(index_elements=[Team.id]))
    if s.execute(_TEAM_FOR_UPDATE, {"lock_team": team}).first() is None:
        s.add(Team(id=team, created_at=time.time()))  # its INSERT holds the new row's lock
        s.flush()


class UsageStore:
    """Mixed into `Store`."""

    if TYPE_CHECKING:
        def session(self) -> AbstractContextManager[Session]: ...

    @contextmanager
    def team_locked(self, team: str) -> Iterator[Session]:
        """A transaction holding the team's write lock (see `lock_team`)."""
        # Teams whose row a committed transaction of this store saw or made: every create
        # takes the lock, and a statement to make sure of the row was one of its eight.
        known: set[str] = self.__dict__.setdefault("_teams_with_rows", set())
        with self.session() as s:
            lock_team(s, team, exists=team in known)
            yield s
        known.add(team)

    def admit(self, rows: Sequence[Sandbox], check: QuotaCheck | None = None,
              at: float | None = None) -> Sequence[Sandbox]:
        """Insert new sandbox rows of one team, after `check` passed, atomically with it;
        rows inserted running (fork children) open their segments at `at`."""
        assert rows and len({row.team for row in rows}) == 1
        at = time.time() if at is None else at
        with self.team_locked(rows[0].team) as s:
            if check is not None:
                check(s, rows[0].team)
            if all(row.state == "starting" for row in rows):
                # A create's row: one Core INSERT, where the ORM's flush cost ~4 times the
                # CPU on every create. Nothing is lost: a starting row has no event (the
                # flush hook skips it, see events_of_flush) and opens no segment. The rows
                # stay plain objects, as `sandbox_by_id` returns them.
                s.execute(insert(SANDBOXES), [insert_values(row) for row in rows])
            else:  # fork children, running at once: the flush hook writes sandbox.forked
                s.add_all(rows)
                s.flush()
            for row in rows:
                meter_state_change(s, row, None, at)
        return rows

    def reserve(self, row: Sandbox, hold: str, check: QuotaCheck,
                states: Sequence[str]) -> bool:
        """Admit `row` as `hold` under the team's lock: if it is still in one of `states`
        and does not hold `hold` yet, run `check` and set its hold in the same transaction.
        True if this call set the hold (then it must `release_hold` it); False if there was
        nothing to reserve (it moved on, or another request's hold already counts it). A hold
        of the other kind is one a killed server left (no request of that kind can be under
        way in these states): it is replaced."""
        with self.team_locked(row.team) as s:
            current = s.get(Sandbox, row.id)
            if current is None or current.state not in states or current.quota_hold == hold:
                return False
            check(s, row.team)
            current.quota_hold = hold
            return True

    def release_hold(self, sandbox_id: str, hold: str) -> None:
        """Drop the sandbox's hold (the host call it admitted has landed or failed). No team
        lock: a release only lowers what the team holds."""
        with self.session() as s:
            s.execute(update(Sandbox).where(Sandbox.id == sandbox_id,
                                            Sandbox.quota_hold == hold)
                      .values(quota_hold=None))

    @contextmanager
    def holding(self, row: Sandbox, hold: str, check: QuotaCheck,
                states: Sequence[str]) -> Iterator[None]:
        """`reserve` for the host call in the block: released if the call fails; after it
        lands, released too (its new state counts now; a stale hold goes with it)."""
        held = self.reserve(row, hold, check, states)
        try:
            yield
        except BaseException:
            if held:
                self.release_hold(row.id, hold)
            raise
        self.release_hold(row.id, hold)

    def reserve_volume(self, volume_id: str, team: str, grow_mb: int,
                       check: QuotaCheck) -> None:
        """Admit a resize's `grow_mb` under the team's lock: `check`, then the volume's
        `reserved_mb` grows by it in the same transaction (`resize_volume_row` or
        `release_volume` gives it back)."""
        with self.team_locked(team) as s:
            check(s, team)
            s.execute(update(Volume).where(Volume.id == volume_id)
                      .values(reserved_mb=Volume.reserved_mb + grow_mb))

    def release_volume(self, volume_id: str, grow_mb: int) -> None:
        with self.session() as s:
            s.execute(update(Volume).where(Volume.id == volume_id)
                      .values(reserved_mb=less_reserved(grow_mb)))

    def check_quota(self, team: str, check: QuotaCheck) -> None:
        """Run `check` under the team's lock (a wake's check, before the VM wakes)."""
        with self.team_locked(team) as s:
            check(s, team)

    def usage_segments(self, team: str | None, start: float, end: float) -> list[UsageSegment]:
        """The team's (None: every team's) segments that overlap [start, end)."""
        q = select(UsageSegment).where(
            UsageSegment.started_at < end,
            or_(UsageSegment.ended_at.is_(None), UsageSegment.ended_at > start))
        if team is not None:
            q = q.where(UsageSegment.team == team)
        with self.session() as s:
            return list(s.scalars(q.order_by(UsageSegment.id)))

    def get_quota(self, team: str) -> TeamQuota | None:
        with self.session() as s:
            return s.get(TeamQuota, team)

    def set_quota(self, team: str, values: dict[str, Any]) -> TeamQuota:
        """Set the given limits of the team's quota (None: back to the server's default)."""
        with self.session() as s:
            if s.get(Team, team) is None:
                s.add(Team(id=team, created_at=time.time()))
                s.flush()
            row = s.get(TeamQuota, team, with_for_update=True)
            if row is None:
                row = TeamQuota(team=team, updated_at=time.time())
                s.add(row)
            for name, value in values.items():
                setattr(row, name, value)
            row.updated_at = time.time()
            return row


def less_reserved(grow_mb: int) -> Any:
    """`reserved_mb` less a resize's share, never below 0 (a share can outlive a restart)."""
    return case((Volume.reserved_mb > grow_mb, Volume.reserved_mb - grow_mb), else_=0)


def _counted(state: str | tuple[str, ...], hold: str) -> Any:
    states = (state,) if isinstance(state, str) else state
    return or_(Sandbox.state.in_(states),
               and_(Sandbox.quota_hold == hold, Sandbox.state.in_(HELD_STATES)))


def active_use(s: Session, team: str) -> tuple[int, int, int]:
    """(sandboxes, vCPUs, memory MiB) of the team's starting, running and paused sandboxes,
    and of those a wake, restart or restore has admitted (`HOLD_AWAKE`)."""
    n, vcpus, memory = s.execute(
        select(func.count(), func.coalesce(func.sum(Sandbox.vcpus), 0),
               func.coalesce(func.sum(Sandbox.memory_mb), 0))
        .where(Sandbox.team == team, _counted(ACTIVE_STATES, HOLD_AWAKE))).one()
    return int(n), int(vcpus), int(memory)


def hibernated_use(s: Session, team: str) -> int:
    """The team's hibernated sandboxes, and those a hibernate has admitted."""
    return int(s.scalar(select(func.count()).where(
        Sandbox.team == team, _counted("hibernated", HOLD_HIBERNATED))) or 0)


def volume_use_gib(s: Session, team: str) -> float:
    """GiB of the team's volumes (their open segments) and of the resizes under way."""
    total = s.scalar(select(func.coalesce(func.sum(UsageSegment.gib), 0.0)).where(
        UsageSegment.team == team, UsageSegment.kind == "volume",
        UsageSegment.ended_at.is_(None)))
    reserved = s.scalar(select(func.coalesce(func.sum(Volume.reserved_mb), 0)).where(
        Volume.team == team, Volume.deleted_at.is_(None)))
    return float(total or 0.0) + int(reserved or 0) / 1024


def snapshot_use_gib(s: Session, team: str) -> float:
    """GiB the team's sandbox and volume snapshots store (their open segments)."""
    total = s.scalar(select(func.coalesce(func.sum(UsageSegment.gib), 0.0)).where(
        UsageSegment.team == team, UsageSegment.kind == "snapshot",
        UsageSegment.ended_at.is_(None)))
    return float(total or 0.0)


#: Template versions whose bytes count: a build under way (its reservation) and a ready one.
TEMPLATE_COUNTED = ("building", "ready")


def template_use_gib(s: Session, team: str) -> float:
    """GiB the team's live template versions store, and what its builds under way reserved
    (`TemplateVersion.size_bytes`)."""
    total = s.scalar(select(func.coalesce(func.sum(TemplateVersion.size_bytes), 0)).where(
        TemplateVersion.team == team, TemplateVersion.status.in_(TEMPLATE_COUNTED),
        TemplateVersion.deleted_at.is_(None)))
    return int(total or 0) / GIB


def segments_since(s: Session, team: str, start: float) -> Iterable[UsageSegment]:
    return s.scalars(select(UsageSegment).where(
        UsageSegment.team == team,
        or_(UsageSegment.ended_at.is_(None), UsageSegment.ended_at > start)))
