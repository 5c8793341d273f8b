"""Repository functions. Every sandbox query takes the team, so one team can never see
another's rows; the few team-less ones are for the reaper and startup reconciliation."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from sqlalchemy import Table, bindparam, delete, func, inspect, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Update

from pandastack.registry import Registry
from pandastack.wire.sandboxes import ENDED_STATES

from .events import record_state_change
from .listing import SandboxListing
from .models import (
    ApiKey,
    Sandbox,
    ServerSecret,
    Snapshot,
    Team,
    TemplateBlob,
    TemplateName,
    TemplateVersion,
)
from .usage import (
    QuotaCheck,
    UsageStore,
    close_segments,
    meter_state_change,
    open_snapshot_segment,
)
from .volume_backups import VolumeBackupStore
from .volumes import VolumeStore, detach_sandboxes

LIVE_STATES = ("starting", "running", "paused", "hibernated", "stopped", "host_lost")
# How long a key found by its hash is trusted without asking the database again: every request
# authenticates, and a SELECT per request was ~2 ms of the event loop's time on a loaded host.
# A revocation made by this process clears the cache at once; one made elsewhere (another API
# server, the CLI on the database) takes effect here within this bound (issue 36: within 1 s).
KEY_CACHE_SECONDS = 0.5
KEY_CACHE_ENTRIES = 1024
Row = TypeVar("Row", Sandbox, TemplateVersion)
_SANDBOX_ATTRS = [(attr.key, attr.columns[0]) for attr in inspect(Sandbox).column_attrs]
_SANDBOX_KEYS = [key for key, _ in _SANDBOX_ATTRS]
_SANDBOX_COLUMNS = [column for _, column in _SANDBOX_ATTRS]
_SANDBOX_COLUMN_OF = dict(_SANDBOX_ATTRS)
SANDBOXES = cast(Table, Sandbox.__table__)
_SANDBOX_BY_ID = select(*_SANDBOX_COLUMNS).where(SANDBOXES.c.id == bindparam("sandbox_id"))


# A kill's write when the caller knows the row's state (`Store.end_sandbox`'s `current`).
_END_STATEMENT = (update(SANDBOXES)
                  .where(SANDBOXES.c.id == bindparam("end_id"),
                         SANDBOXES.c.state == bindparam("end_from"))
                  .values(state=bindparam("end_state"), ended_at=bindparam("end_at"),
                          end_reason=bindparam("end_reason"))
                  .returning(*_SANDBOX_COLUMNS))


@functools.cache
def _start_statement(names: tuple[str, ...]) -> Update:
    """`start_sandbox`'s UPDATE setting these attributes, built once: building a statement
    and its cache key each time cost more than the ORM path it replaces."""
    return (update(SANDBOXES)
            .where(SANDBOXES.c.id == bindparam("start_id"), SANDBOXES.c.state == "starting")
            .values(state="running", **{_SANDBOX_COLUMN_OF[name].name: bindparam(f"start_{name}")
                                        for name in names})
            .returning(*_SANDBOX_COLUMNS))


class Store(Registry, UsageStore, VolumeStore, VolumeBackupStore, SandboxListing):
    """The registry's engine and sessions (and its host and lease queries), with the
    control plane's own tables. Every write of a sandbox's state meters it in the same
    transaction (store/usage.py)."""

    def _update(self, model: type[Row], key: str, values: dict[str, Any]) -> Row | None:
        """Set `values` on the row of `model` with primary key `key`; None if there is none."""
        with self.session() as s:
            row = s.get(model, key)
            if row is None:
                return None
            for name, value in values.items():
                setattr(row, name, value)
            return row

    # -- teams and keys -------------------------------------------------------------------

    def ensure_team(self, s: Session, team: str) -> None:
        if s.get(Team, team) is None:
            s.add(Team(id=team, created_at=time.time()))
            s.flush()

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        # digest -> (monotonic time it was read, the key): found keys only, so a key created
        # by another process works at once
        self._keys_by_hash: dict[str, tuple[float, ApiKey]] = {}

    def add_key(self, key: ApiKey) -> ApiKey:
        with self.session() as s:
            self.ensure_team(s, key.team)
            s.add(key)
        return key

    def key_by_hash(self, digest: str) -> ApiKey | None:
        """The key with this hash (revoked or not), read at most `KEY_CACHE_SECONDS` ago."""
        now = time.monotonic()
        cached = self._keys_by_hash.get(digest)
        if cached is not None and now - cached[0] < KEY_CACHE_SECONDS:
            return cached[1]
        with self.session() as s:
            key = s.scalars(select(ApiKey).where(ApiKey.hash == digest)).first()
        if key is not None:
            if len(self._keys_by_hash) >= KEY_CACHE_ENTRIES:
                self._keys_by_hash.clear()
            self._keys_by_hash[digest] = (now, key)
        return key

    def get_key(self, key_id: str) -> ApiKey | None:
        with self.session() as s:
            return s.get(ApiKey, key_id)

    def list_keys(self, team: str | None = None) -> list[ApiKey]:
        with self.session() as s:
            q = select(ApiKey).order_by(ApiKey.created_at)
            if team is not None:
                q = q.where(ApiKey.team == team)
            return list(s.scalars(q))

    def revoke_key(self, key_id: str) -> ApiKey | None:
        with self.session() as s:
            key = s.get(ApiKey, key_id)
            if key is not None and key.revoked_at is None:
                key.revoked_at = time.time()
        self._keys_by_hash.clear()
        return key

    def has_admin_key(self) -> bool:
        with self.session() as s:
            q = select(ApiKey.id).where(ApiKey.admin.is_(True), ApiKey.revoked_at.is_(None))
            return s.scalars(q).first() is not None

    # -- sandboxes ------------------------------------------------------------------------

    def add_sandbox(self, row: Sandbox) -> Sandbox:
        with self.session() as s:
            self.ensure_team(s, row.team)
            s.add(row)
            if row.state != "starting":
                s.flush()
                meter_state_change(s, row, None, time.time())
        return row

    def get_sandbox(self, team: str, sandbox_id: str) -> Sandbox | None:
        row = self.sandbox_by_id(sandbox_id)
        return row if row is not None and row.team == team else None

    def sandbox_by_id(self, sandbox_id: str) -> Sandbox | None:
        """Any team's sandbox: only for callers that proved their right to it another way
        (a signed URL). The row as a plain (transient) `Sandbox` read by one Core SELECT:
        nearly every request reads its sandbox's row, and an ORM session's get cost twice
        the CPU (identity map, loading, the session's own transaction). Nothing adds the row
        to a session: the writes look their rows up again."""
        with self.engine.connect() as conn:
            got = conn.execute(_SANDBOX_BY_ID, {"sandbox_id": sandbox_id}).first()
        return None if got is None else Sandbox(**dict(zip(_SANDBOX_KEYS, got, strict=True)))

    def list_sandboxes(self, team: str, state: str | None = None) -> list[Sandbox]:
        with self.session() as s:
            q = select(Sandbox).where(Sandbox.team == team).order_by(Sandbox.created_at)
            if state is not None:
                q = q.where(Sandbox.state == state)
            return list(s.scalars(q))

    def live_sandboxes(self) -> list[Sandbox]:
        with self.session() as s:
            return list(s.scalars(select(Sandbox).where(Sandbox.state.in_(LIVE_STATES))))

    def update_sandbox(self, sandbox_id: str, **values: Any) -> Sandbox | None:
        if "state" not in values:
            return self._update(Sandbox, sandbox_id, values)
        with self.session() as s:
            row = s.get(Sandbox, sandbox_id, with_for_update=True)
            if row is None:
                return None
            old = row.state
            for name, value in values.items():
                setattr(row, name, value)
            meter_state_change(s, row, old, time.time())
            return row

    def start_sandbox(self, sandbox_id: str, **values: Any) -> Sandbox | None:
        """A create's `starting` row becomes `running` with `values`, metered in the same
        transaction; None if the row is no longer `starting` (killed while it started). One
        transaction where a read and then an update were two: it is on every create's path."""
        # Core statements: the ORM's read, flush and event hook cost twice the CPU. The
        # UPDATE's WHERE is the check: a kill that committed first leaves nothing to match.
        with self.session() as s:
            got = s.execute(_start_statement(tuple(sorted(values))),
                            {"start_id": sandbox_id,
                             **{f"start_{name}": value for name, value in values.items()}}
                            ).first()
            if got is None:
                return None
            row = Sandbox(**dict(zip(_SANDBOX_KEYS, got, strict=True)))
            meter_state_change(s, row, "starting", time.time())
            record_state_change(s, row, "starting", "running")
            return row

    def set_live_state(self, sandbox_id: str, state: str) -> Sandbox | None:
        """Move a live row between running, paused and hibernated; an ended (or still
        starting) row is left as it is."""
        assert state in ("running", "paused", "hibernated")
        with self.session() as s:
            row = s.get(Sandbox, sandbox_id, with_for_update=True)
            if (row is not None and row.state in ("running", "paused", "hibernated")
                    and row.state != state):
                old, row.state = row.state, state
                meter_state_change(s, row, old, time.time())
            return row

    def stop_sandbox(self, sandbox_id: str, reason: str) -> Sandbox | None:
        """A live row whose VM died becomes `stopped` (ADR 0037), with why; a row that ended,
        is still starting or is stopped already is left as it is."""
        with self.session() as s:
            row = s.get(Sandbox, sandbox_id, with_for_update=True)
            if row is not None and row.state in ("running", "paused", "hibernated"):
                old, row.state = row.state, "stopped"
                row.stop_reason = reason
                meter_state_change(s, row, old, time.time())
            return row

    def end_sandbox(self, sandbox_id: str, state: str, reason: str,
                    now: float | None = None, *, current: str | None = None
                    ) -> Sandbox | None:
        """Move a live row to an ended state; a row that already ended is left as it is.
        `current`: the live state the caller read the row in. The row then moves from it in
        one UPDATE ... RETURNING with no read before it (a kill's path: its route has just
        read the row); if it moved on meanwhile, it is read and ended as without `current`."""
        assert state in ENDED_STATES
        at = time.time() if now is None else now
        if current is not None and current not in ENDED_STATES:
            with self.session() as s:
                got = s.execute(_END_STATEMENT, {"end_id": sandbox_id, "end_from": current,
                                                 "end_state": state, "end_at": at,
                                                 "end_reason": reason}).first()
                if got is not None:
                    ended = Sandbox(**dict(zip(_SANDBOX_KEYS, got, strict=True)))
                    # What the flush hook and the ORM path below write, in this transaction.
                    record_state_change(s, ended, current, state)
                    meter_state_change(s, ended, current, at)
                    detach_sandboxes(s, [ended.id])
                    return ended
        with self.session() as s:
            row = s.get(Sandbox, sandbox_id, with_for_update=True)
            if row is None or row.state in ENDED_STATES:
                return row
            old, row.state = row.state, state
            row.ended_at = at
            row.end_reason = reason
            meter_state_change(s, row, old, row.ended_at)
            detach_sandboxes(s, [row.id])
            return row

    def touch(self, sandbox_id: str, now: float | None = None) -> None:
        with self.session() as s:
            s.execute(update(Sandbox).where(Sandbox.id == sandbox_id)
                      .values(last_activity_at=time.time() if now is None else now))

    def purge_ended(self, before: float) -> int:
        """Delete ended rows whose `ended_at` is older than `before`; returns how many."""
        with self.session() as s:
            result = s.execute(delete(Sandbox).where(Sandbox.state.in_(tuple(ENDED_STATES)),
                                                     Sandbox.ended_at < before))
            return int(getattr(result, "rowcount", 0) or 0)

    # -- snapshots ------------------------------------------------------------------------

    def add_snapshot(self, row: Snapshot, check: QuotaCheck | None = None) -> Snapshot:
        """Record a snapshot the host took, after `check` (the team's max_snapshot_gb with
        its size) passed under the team's lock, atomically with it."""
        with self.team_locked(row.team) as s:
            if check is not None:
                check(s, row.team)
            s.add(row)
            open_snapshot_segment(s, row, time.time())
        return row

    def get_snapshot(self, team: str, snapshot_id: str) -> Snapshot | None:
        """The team's snapshot, unless it was deleted."""
        with self.session() as s:
            row = s.get(Snapshot, snapshot_id)
            ok = row is not None and row.team == team and row.deleted_at is None
            return row if ok else None

    def list_snapshots(self, team: str | None) -> list[Snapshot]:
        """The team's (None: every team's) snapshots that were not deleted, oldest first."""
        with self.session() as s:
            q = (select(Snapshot).where(Snapshot.deleted_at.is_(None))
                 .order_by(Snapshot.created_at))
            if team is not None:
                q = q.where(Snapshot.team == team)
            return list(s.scalars(q))

    def newest_snapshot_of(self, sandbox_id: str) -> Snapshot | None:
        """The newest snapshot taken of the sandbox that was not deleted."""
        with self.session() as s:
            return s.scalars(select(Snapshot).where(Snapshot.source_sandbox == sandbox_id,
                                                    Snapshot.deleted_at.is_(None))
                             .order_by(Snapshot.created_at.desc()).limit(1)).first()

    def mark_host_lost(self, host_ids: Iterable[str]) -> list[str]:
        """Every sandbox with a VM (or a hibernation) on these hosts becomes host_lost; the
        ids of those that did."""
        with self.session() as s:
            rows = list(s.scalars(select(Sandbox).where(
                Sandbox.host_id.in_(list(host_ids)),
                Sandbox.state.in_(("running", "paused", "hibernated")))
                .with_for_update()))
            for row in rows:
                row.state = "host_lost"
            if rows:  # nothing is held for them now: their VMs went with the host
                close_segments(s, [row.id for row in rows], ("compute", "disk"), time.time())
            # Their volume attachments stay until they are killed: a hibernated one's memory
            # has them mounted, and the volumes are on that host, which may come back.
            return [row.id for row in rows]

    def delete_snapshot(self, snapshot_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.session() as s:
            s.execute(update(Snapshot).where(Snapshot.id == snapshot_id,
                                             Snapshot.deleted_at.is_(None))
                      .values(deleted_at=now))
            close_segments(s, [snapshot_id], ("snapshot",), now)

    # -- templates ------------------------------------------------------------------------
    # Hot paths (a create from a team template, list, versions, build status) read only
    # `template_versions` rows, never a build's spec or logs (`template_blobs`), and leave
    # deleted rows out in SQL.

    def add_template_version(self, row: TemplateVersion, spec: dict[str, Any],
                             attempts: int = 5,
                             check: QuotaCheck | None = None) -> TemplateVersion:
        """Insert `row` (and its `spec`) as the next version of its team's template. The
        number is past every number the name ever had, pruned versions included. `check`
        (max_template_gb with the row's reservation, `size_bytes`) runs under the team's
        lock, in the insert's transaction: racing builds cannot both pass it."""
        for attempt in range(attempts):
            try:
                with (self.session() if check is None else self.team_locked(row.team)) as s:
                    if check is not None:
                        check(s, row.team)
                    self.ensure_team(s, row.team)
                    row.version = self._take_version_number(s, row.team, row.name)
                    s.add(row)
                    s.flush()
                    s.add(TemplateBlob(build_id=row.id, spec=spec))
                return row
            except IntegrityError:  # another build (maybe another server) took that number
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _take_version_number(self, s: Session, team: str, name: str) -> int:
        counter = s.get(TemplateName, (team, name))
        newest = s.scalar(select(func.max(TemplateVersion.version)).where(
            TemplateVersion.team == team, TemplateVersion.name == name)) or 0
        number = max(newest, counter.last_version if counter is not None else 0) + 1
        if counter is None:
            s.add(TemplateName(team=team, name=name, last_version=number))
        else:
            counter.last_version = number
        return number

    def get_template_build(self, team: str, build_id: str) -> TemplateVersion | None:
        """The team's build, unless it was deleted."""
        with self.session() as s:
            return s.scalars(select(TemplateVersion).where(
                TemplateVersion.id == build_id, TemplateVersion.team == team,
                TemplateVersion.deleted_at.is_(None))).first()

    def template_versions(self, team: str, name: str | None = None) -> list[TemplateVersion]:
        """The team's versions that were not deleted (of one template, or all), oldest first."""
        with self.session() as s:
            q = (select(TemplateVersion)
                 .where(TemplateVersion.team == team, TemplateVersion.deleted_at.is_(None))
                 .order_by(TemplateVersion.name, TemplateVersion.version))
            if name is not None:
                q = q.where(TemplateVersion.name == name)
            return list(s.scalars(q))

    def newest_template_versions(self, team: str) -> list[TemplateVersion]:
        """The newest version (any status) of each of the team's template names that has
        one not deleted, by name."""
        live = (TemplateVersion.team == team, TemplateVersion.deleted_at.is_(None))
        newest = (select(TemplateVersion.name, func.max(TemplateVersion.version).label("v"))
                  .where(*live).group_by(TemplateVersion.name).subquery())
        with self.session() as s:
            return list(s.scalars(
                select(TemplateVersion).join(newest, (TemplateVersion.name == newest.c.name)
                                             & (TemplateVersion.version == newest.c.v))
                .where(*live).order_by(TemplateVersion.name)))

    def template_version(self, team: str, name: str, version: int | None = None, *,
                         ready: bool = False) -> TemplateVersion | None:
        """Version `version` of the team's template (None: the newest; `ready`: the newest
        ready one), unless deleted."""
        q = select(TemplateVersion).where(TemplateVersion.team == team,
                                          TemplateVersion.name == name,
                                          TemplateVersion.deleted_at.is_(None))
        if version is not None:
            q = q.where(TemplateVersion.version == version)
        if ready:
            q = q.where(TemplateVersion.status == "ready")
        with self.session() as s:
            return s.scalars(q.order_by(TemplateVersion.version.desc()).limit(1)).first()

    def all_template_versions(self) -> list[TemplateVersion]:
        """Every team's versions that were not deleted: for startup reconciliation."""
        with self.session() as s:
            return list(s.scalars(select(TemplateVersion)
                                  .where(TemplateVersion.deleted_at.is_(None))))

    def update_template_version(self, build_id: str, **values: Any) -> TemplateVersion | None:
        return self._update(TemplateVersion, build_id, values)

    def finish_template_build(self, build_id: str, logs: str,
                              values: dict[str, Any]) -> TemplateVersion | None:
        """Record the end of a build: `values` on its row, `logs` in its blob."""
        with self.session() as s:
            s.execute(update(TemplateBlob).where(TemplateBlob.build_id == build_id)
                      .values(logs=logs))
            row = s.get(TemplateVersion, build_id)
            if row is not None:
                for name, value in values.items():
                    setattr(row, name, value)
            return row

    def template_build_logs(self, team: str, build_id: str) -> str | None:
        """The stored log of the team's build (None: no such build, or deleted)."""
        with self.session() as s:
            logs: str | None = s.scalar(
                select(TemplateBlob.logs).join(TemplateVersion,
                                               TemplateVersion.id == TemplateBlob.build_id)
                .where(TemplateBlob.build_id == build_id, TemplateVersion.team == team,
                       TemplateVersion.deleted_at.is_(None)))
            return logs

    def delete_template_version(self, build_id: str, now: float | None = None) -> None:
        with self.session() as s:
            s.execute(update(TemplateVersion).where(TemplateVersion.id == build_id,
                                                    TemplateVersion.deleted_at.is_(None))
                      .values(deleted_at=time.time() if now is None else now))

    def purge_template_versions(self, before: float) -> int:
        """Delete, with their blobs, versions deleted before `before` and failed builds that
        ended before it; returns how many. Their names keep their numbers taken."""
        dead = or_(TemplateVersion.deleted_at < before,
                   (TemplateVersion.status == "failed")
                   & (func.coalesce(TemplateVersion.finished_at,
                                    TemplateVersion.created_at) < before))
        with self.session() as s:
            rows = s.execute(select(TemplateVersion.id, TemplateVersion.team,
                                    TemplateVersion.name, TemplateVersion.version)
                             .where(dead)).all()
            if not rows:
                return 0
            taken: dict[tuple[str, str], int] = {}
            for _, team, name, version in rows:
                taken[(team, name)] = max(version, taken.get((team, name), 0))
            for (team, name), version in taken.items():
                counter = s.get(TemplateName, (team, name))
                if counter is None:
                    s.add(TemplateName(team=team, name=name, last_version=version))
                elif counter.last_version < version:
                    counter.last_version = version
            ids = [row[0] for row in rows]
            for chunk in range(0, len(ids), 500):  # bound the statement's parameters
                part = ids[chunk:chunk + 500]
                s.execute(delete(TemplateBlob).where(TemplateBlob.build_id.in_(part)))
                s.execute(delete(TemplateVersion).where(TemplateVersion.id.in_(part)))
            return len(ids)

    # -- server secrets -------------------------------------------------------------------

    def server_secret(self, name: str, make: Callable[[], str]) -> str:
        """The secret `name`, created with `make()` the first time (the first writer wins
        when several servers share the database)."""
        with self.session() as s:
            row = s.get(ServerSecret, name)
            if row is not None:
                return row.value
        value = make()
        try:
            with self.session() as s:
                s.add(ServerSecret(name=name, value=value, created_at=time.time()))
        except IntegrityError:
            with self.session() as s:
                row = s.get(ServerSecret, name)
                assert row is not None
                return row.value
        return value
