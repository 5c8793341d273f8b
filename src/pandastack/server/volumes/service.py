"""Volumes at the API level (ADR 0027): the store keeps names, teams and attachments, the
host that holds a volume keeps its image. Every runtime call about an existing volume is
pinned to that volume's host (`hosts.pinning`): a pool of hosts routes it there.

Attachments are made only when a sandbox is made (create, fork, create from a snapshot), in
the transaction of its row (`store.volumes.attach`): one writer per volume, read-only ones
shared. A fork's child, and a sandbox created from a snapshot, get a copy of each read-write
volume (made by the host under `rules.clone_volume_id`) as a new volume of the team named
`{name}-{child id without "sbx-"}`, and share the read-only ones."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import IntegrityError

from pandastack.hostport.errors import VolumeNotFound
from pandastack.hostport.protocols import RuntimePort
from pandastack.hostport.volumes import HostVolume, VolumeMountRequest, VolumePort
from pandastack.rules import (
    DEFAULT_VOLUME_MB,
    SNAPSHOT_ID_RE,
    VOLUME_NAME_PATTERN,
    clone_volume_id,
    new_volume_id,
)
from pandastack.wire.resources import CreateVolume, VolumeAttachment, VolumeInfo
from pandastack.wire.sandboxes import AttachedVolume, CreateSandbox

from ..accounts.quotas import Quotas
from ..hosts.pinning import pinned_host
from ..store import Sandbox, Store, Volume
from ..store.usage import QuotaCheck
from ..store.volumes import PlannedAttach, VolumeConflict, VolumeGone, attaching
from ..web.errors import ApiError, conflict, host_call, not_found
from .snapshots import VolumeSnapshots

#: The longest volume name (rules.VOLUME_NAME_PATTERN: 63 characters).
MAX_NAME = 63
VOLUME_NAME_RE = re.compile(VOLUME_NAME_PATTERN)


def in_use(message: str) -> ApiError:
    return ApiError(409, "volume_in_use", message)


async def _lost_is_deleted(op: Awaitable[None]) -> None:
    # A volume its host lost already is as good as deleted there: the row still goes.
    with suppress(VolumeNotFound):
        await op


def clone_name(name: str, sandbox_id: str) -> str:
    """The name of the copy of volume `name` that sandbox `sandbox_id` gets: unique, since
    sandbox ids are, and within the name's length (the source's name is cut to fit)."""
    suffix = "-" + sandbox_id.removeprefix("sbx-")
    return name[:MAX_NAME - len(suffix)] + suffix


@dataclass
class CreatePlan:
    """What a create does about volumes: the attachments its row gets, the mounts it asks
    the host for (none from a snapshot: the host restores the snapshot's), and the host it
    must land on (None: any)."""

    attach: list[PlannedAttach] = field(default_factory=list)
    mounts: list[VolumeMountRequest] = field(default_factory=list)
    host_id: str | None = None


def snapshot_record(entries: Sequence[tuple[Any, Volume]]) -> list[dict[str, Any]]:
    """What a snapshot keeps of its sandbox's attachments (`Snapshot.volumes`)."""
    return [{"id": v.id, "name": v.name, "mount_path": a.mount_path,
             "read_only": a.read_only, "size_mb": v.size_mb, "host_id": v.host_id}
            for a, v in entries]


class VolumeService:
    def __init__(self, store: Store, runtime: RuntimePort, quotas: Quotas) -> None:
        self.store = store
        self.runtime = runtime
        self.quotas = quotas
        self.snapshots = VolumeSnapshots(self)

    # -- lookups --------------------------------------------------------------------------

    @property
    def port(self) -> VolumePort:
        if not isinstance(self.runtime, VolumePort):
            raise ApiError(503, "unavailable", "this server's host does not hold volumes")
        return self.runtime

    def row(self, team: str, name: str) -> Volume:
        """The team's live volume `name`, or 404 (also another team's)."""
        row = self.store.get_volume(team, name) if VOLUME_NAME_RE.match(name) else None
        if row is None:
            raise not_found(f"volume {name!r}")
        return row

    def infos(self, rows: Sequence[Volume]) -> list[VolumeInfo]:
        held = self.store.volume_attachments([r.id for r in rows])
        return [VolumeInfo(id=r.id, name=r.name, size_mb=r.size_mb, created_at=r.created_at,
                           host_id=r.host_id, source_volume=r.source_volume,
                           attachments=[VolumeAttachment(sandbox_id=a.sandbox_id,
                                                         mount_path=a.mount_path,
                                                         read_only=a.read_only)
                                        for a in held.get(r.id, [])])
                for r in rows]

    def attached(self, sandbox_ids: Sequence[str]) -> dict[str, list[AttachedVolume]]:
        """Each sandbox's attachments (`SandboxInfo.volumes`)."""
        return {sid: [AttachedVolume(id=v.id, name=v.name, mount_path=a.mount_path,
                                     read_only=a.read_only) for a, v in entries]
                for sid, entries in self.store.sandbox_attachments(sandbox_ids).items()}

    @contextmanager
    def pinned(self, host_id: str | None) -> Iterator[None]:
        """Route the calls inside to `host_id` (the volume's host; None: leave as it is)."""
        current = pinned_host.get()
        if host_id is None or current == host_id:
            yield
            return
        if current is not None:
            raise ApiError(422, "validation_error", f"host_id: the volumes are on host "
                           f"{host_id}, not {current}")
        token = pinned_host.set(host_id)
        try:
            yield
        finally:
            pinned_host.reset(token)

    # -- the volumes API ------------------------------------------------------------------

    async def create(self, team: str, req: CreateVolume) -> Volume:
        """A new empty volume (409 if the team has one of that name), or one holding a
        volume snapshot (`req.from_snapshot`); `req.host_id` is pinned by the caller (admin
        only)."""
        if req.from_snapshot is not None:
            return await self.snapshots.restore(team, req)
        size_mb = DEFAULT_VOLUME_MB if req.size_mb is None else req.size_mb
        return await self.make(team, req.name, size_mb, None,
                               lambda port, vid: port.create_volume(vid, size_mb))

    async def make(self, team: str, name: str, size_mb: int, source_volume: str | None,
                   build: Callable[[VolumePort, str], Awaitable[HostVolume]]) -> Volume:
        """A new volume row (after the team's quota), then `build(port, id)` on a host: the
        row goes again if the host does not make it."""
        row = Volume(id=new_volume_id(), team=team, name=name, size_mb=size_mb,
                     host_id=None, source_volume=source_volume, created_at=time.time(),
                     deleted_at=None)
        port = self.port

        def quota(s: Any, team: str) -> None:
            self.quotas.check_volume(s, team, size_mb)
        try:
            self.store.add_volume(row, quota)
        except IntegrityError:
            raise conflict(f"the team has a volume named {name!r}") from None
        try:
            made = await host_call(build(port, row.id))
        except BaseException:
            self.store.forget_volume(row.id)
            raise
        host_id = made.host_id or pinned_host.get()
        if host_id is not None:
            self.store.set_volume_host(row.id, host_id)
            row.host_id = host_id
        return row

    async def delete(self, team: str, name: str) -> None:
        """409 volume_in_use while a sandbox that has not ended has it attached."""
        row = self.row(team, name)
        self._detached(row, "delete")
        port = self.port
        with self.pinned(row.host_id):
            await host_call(_lost_is_deleted(port.delete_volume(row.id)))
        self.store.mark_volume_deleted(row.id)

    async def resize(self, team: str, name: str, size_mb: int) -> Volume:
        """Grow a detached volume (its file system follows): 409 while attached, 422 to
        shrink it, 429 past the team's volume quota."""
        row = self.row(team, name)
        if size_mb < row.size_mb:
            raise ApiError(422, "validation_error", f"size_mb: volume {name!r} is "
                           f"{row.size_mb} MiB; a volume can grow, not shrink")
        if size_mb == row.size_mb:
            return row
        self._detached(row, "resize")
        grow = size_mb - row.size_mb

        def quota(s: Any, team: str) -> None:
            self.quotas.check_volume(s, team, grow)
        # The growth counts from the check on (a racing resize sees it), not from the row's
        # update after the host call.
        self.store.reserve_volume(row.id, team, grow, quota)
        port = self.port
        try:
            with self.pinned(row.host_id):
                await host_call(port.resize_volume(row.id, size_mb))
        except BaseException:
            self.store.release_volume(row.id, grow)
            raise
        self.store.resize_volume_row(row.id, size_mb, reserved_mb=grow)
        row.size_mb = size_mb
        return row

    def _detached(self, row: Volume, what: str) -> None:
        if row.moving_to is not None:
            raise in_use(f"volume {row.name!r} is being moved to host {row.moving_to}: "
                         f"cannot {what} it until the move ends")
        held = self.store.volume_attachments([row.id])[row.id]
        if held:
            raise in_use(f"volume {row.name!r} is attached to "
                         f"{', '.join(a.sandbox_id for a in held)}: cannot {what} it until "
                         "they end")

    # -- sandboxes that get volumes -------------------------------------------------------

    def plan_create(self, team: str, req: CreateSandbox, sandbox_id: str) -> CreatePlan:
        """The volumes of a new sandbox (a worker thread's lookups): 404 unknown names, 422
        mount paths used twice, one volume twice, volumes on different hosts, or `volumes`
        with a snapshot (a snapshot's own volumes come with it)."""
        if req.snapshot is not None:
            if req.volumes:
                raise ApiError(422, "validation_error", "volumes: a sandbox created from a "
                               "snapshot gets the snapshot's volumes; leave them out")
            return self._plan_restore(team, req.snapshot, sandbox_id)
        if not req.volumes:
            return CreatePlan()
        paths = [v.mount_path.rstrip("/") or "/" for v in req.volumes]
        if len(set(paths)) != len(paths):
            raise ApiError(422, "validation_error", "volumes: two volumes at one mount_path")
        names = [v.name for v in req.volumes]
        if len(set(names)) != len(names):
            raise ApiError(422, "validation_error", "volumes: a volume named twice")
        rows: dict[str, Volume] = {}
        for v in req.volumes:
            rows[v.name] = self.row(team, v.name)
        hosts = {r.host_id for r in rows.values()}
        if len(hosts) > 1:
            raise ApiError(422, "validation_error", "volumes: they live on different hosts "
                           f"({', '.join(sorted(str(h) for h in hosts))}); a sandbox mounts "
                           "volumes of one host")
        plan = CreatePlan(host_id=next(iter(hosts)))
        for v in req.volumes:
            vid = rows[v.name].id
            plan.attach.append(PlannedAttach(vid, v.mount_path, v.read_only))
            plan.mounts.append(VolumeMountRequest(vid, v.mount_path, v.read_only))
        return plan

    def _plan_restore(self, team: str, snapshot_id: str, sandbox_id: str) -> CreatePlan:
        snap = (self.store.get_snapshot(team, snapshot_id)
                if SNAPSHOT_ID_RE.match(snapshot_id) else None)
        recorded = list(snap.volumes or []) if snap is not None else []
        if not recorded:
            return CreatePlan()
        shared = self.store.volumes_by_id(team, [e["id"] for e in recorded if e["read_only"]])
        plan = CreatePlan()
        for e in recorded:
            if e["read_only"]:
                # A shared volume stays on its host, and so must the sandbox. The copies of
                # read-write ones travel with the snapshot (its manifest in the object store).
                plan.host_id = plan.host_id or e.get("host_id")
                if e["id"] not in shared:
                    raise not_found(f"volume {e['name']!r} (read-only in snapshot "
                                    f"{snapshot_id}; deleted since)")
                plan.attach.append(PlannedAttach(e["id"], e["mount_path"], True))
            else:
                plan.attach.append(self._clone(team, e["id"], e["name"], e["size_mb"],
                                               e.get("host_id"), e["mount_path"], sandbox_id))
        return plan

    def _clone(self, team: str, volume_id: str, name: str, size_mb: int,
               host_id: str | None, mount_path: str, sandbox_id: str) -> PlannedAttach:
        copy = Volume(id=clone_volume_id(volume_id, sandbox_id), team=team,
                      name=clone_name(name, sandbox_id), size_mb=size_mb, host_id=host_id,
                      source_volume=volume_id, created_at=time.time(), deleted_at=None)
        return PlannedAttach(copy.id, mount_path, False, clone=copy)

    def plan_fork(self, parent: Sandbox,
                  child_ids: Sequence[str]) -> list[tuple[str, list[PlannedAttach]]]:
        """Each child's attachments: a copy of each read-write volume of the parent, the
        read-only ones shared."""
        entries = self.store.sandbox_attachments([parent.id]).get(parent.id, [])
        plans: list[tuple[str, list[PlannedAttach]]] = []
        for child in child_ids:
            plan: list[PlannedAttach] = []
            for a, v in entries:
                if a.read_only:
                    plan.append(PlannedAttach(v.id, a.mount_path, True))
                else:
                    plan.append(self._clone(parent.team, v.id, v.name, v.size_mb, v.host_id,
                                            a.mount_path, child))
            plans.append((child, plan))
        return plans

    def place_clones(self, plan: CreatePlan, host_id: str | None) -> None:
        """The copies a new sandbox got live where it landed."""
        for p in plan.attach:
            if p.clone is not None and host_id is not None and p.clone.host_id != host_id:
                self.store.set_volume_host(p.clone.id, host_id)

    def host_of_attached(self, sandbox_id: str) -> str | None:
        """The host of the sandbox's volumes (a fork of it must land there)."""
        entries = self.store.sandbox_attachments([sandbox_id]).get(sandbox_id, [])
        return next((v.host_id for _, v in entries if v.host_id is not None), None)

    def record(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The attachments a snapshot of the sandbox records."""
        return snapshot_record(self.store.sandbox_attachments([sandbox_id]).get(sandbox_id,
                                                                                []))

    def admit(self, rows: Sequence[Sandbox], check: QuotaCheck | None,
              plans: Sequence[tuple[str, Sequence[PlannedAttach]]],
              at: float | None = None) -> Sequence[Sandbox]:
        """`store.admit` with the attachments of `plans` in the same transaction: 404 if a
        volume went meanwhile, 409 volume_in_use for a second writer; clones of volumes
        count against the team's volume quota."""
        grow = sum(p.clone.size_mb for _, plan in plans for p in plan if p.clone is not None)
        inner = check
        if grow:
            def inner(s: Any, team: str) -> None:
                if check is not None:
                    check(s, team)
                self.quotas.check_volume(s, team, grow)
        try:
            return self.store.admit(rows, attaching(inner, plans, at), at=at)
        except VolumeGone as exc:
            raise not_found(f"volume {exc} (deleted meanwhile)") from None
        except VolumeConflict as exc:
            raise in_use(str(exc)) from None
        except IntegrityError:
            # Two copies named alike (only if a sandbox id repeats): the attach rule holds.
            raise in_use("a copy of a volume could not be recorded") from None

    async def forget_clones(self, plans: Sequence[tuple[str, Sequence[PlannedAttach]]]) -> None:
        """Remove the copies a host made for children that could not be recorded."""
        for _, plan in plans:
            for p in plan:
                if p.clone is None:
                    continue
                # Best effort: at worst the host keeps a copy nobody names.
                with suppress(Exception), self.pinned(p.clone.host_id):
                    await self.port.delete_volume(p.clone.id)
