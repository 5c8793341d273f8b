"""The registry's hosts as an admin sees them, and drain: a host that takes no new sandbox,
and whose running ones move to other hosts under the same id.

A running sandbox moves live (ADR 0023): the target gets ready for it, the source's VMM
streams its memory straight to the target's while it runs, and it pauses only for the
switch (the last memory, its top disk layer); the lease moves with it. Where that fails
before the switch (the source then runs on as if nothing happened), and for a paused
sandbox, the move is cold: hibernated on its host (its memory, processes and disk written
to the object store), woken on the best other host (which fetches them), and the source
then drops its copy; the sandbox keeps its id, processes and files, paused for the whole
move. A hibernated sandbox stays where it is: its state is already in the object store, and
a wake after its host is gone restores it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pandastack.hostport.errors import HostError, HostExhausted, SandboxNotFound
from pandastack.hostport.protocols import MigrationPort
from pandastack.hostport.results import MigrationDocument

from ..web.errors import ApiError, api_error_of
from .placement import Shape
from .pool import _Held, first_taker

if TYPE_CHECKING:
    from ..sandboxes.service import SandboxService
    from .cluster import ClusterPool

log = logging.getLogger("pandastack.server")


@dataclass(frozen=True)
class HostStatus:
    id: str
    endpoint: str
    state: str  # "live" | "draining" | "incompatible" | "stale" | "lost"
    vcpus: int
    memory_mb: int
    disk_mb: int
    used_vcpus: int
    used_memory_mb: int
    sandboxes: int
    templates: tuple[str, ...]
    labels: dict[str, str]
    version: str
    epoch: int
    heartbeat_age_seconds: float
    protocol: int = 1
    incompatible_reason: str = ""  # why this server places nothing there (hostport/compat)


@dataclass
class DrainReport:
    host_id: str
    moved: dict[str, str] = field(default_factory=dict)  # sandbox -> the host it went to
    failed: dict[str, str] = field(default_factory=dict)  # sandbox -> why it stayed
    stayed_hibernated: list[str] = field(default_factory=list)
    moved_live: list[str] = field(default_factory=list)  # of `moved`, those that moved live


def _cluster(service: SandboxService) -> ClusterPool:
    if service.cluster is None:
        raise ApiError(409, "conflict", "this server drives one host, not a cluster of them "
                       "(`pandastack serve --db DSN --no-local-agent`)")
    return service.cluster


def _status(row: Any, now: float, lost: bool, stale: bool,
            incompatible: str | None = None) -> HostStatus:
    state = ("lost" if lost else "stale" if stale else "incompatible" if incompatible
             else "draining" if row.draining else "live")
    return HostStatus(
        id=row.id, endpoint=row.endpoint, state=state,
        vcpus=row.vcpus, memory_mb=row.memory_mb, disk_mb=row.disk_mb,
        used_vcpus=int(getattr(row, "used_vcpus", 0) or 0),
        used_memory_mb=int(getattr(row, "used_memory_mb", 0) or 0),
        sandboxes=int(getattr(row, "sandboxes", 0) or 0),
        templates=tuple(getattr(row, "templates", None) or ()), labels=dict(row.labels or {}),
        version=row.version, epoch=row.epoch,
        heartbeat_age_seconds=round(max(0.0, now - row.last_heartbeat_at), 3),
        protocol=int(getattr(row, "protocol", 1)), incompatible_reason=incompatible or "")


async def host_statuses(service: SandboxService) -> list[HostStatus]:
    """Every registered host (an empty list where the server drives one host)."""
    if service.cluster is None:
        return []
    cluster = service.cluster
    await cluster.refresh(force=True)
    rows, now = await asyncio.to_thread(
        lambda: (service.store.list_hosts(), service.store.db_time()))
    # Stale and not yet lost (the loss grace after a failed read of the registry): it takes
    # no sandbox and its requests are 503, so it must not read as live.
    return [_status(r, now, cluster.is_lost(r.id),
                    r.last_heartbeat_at < now - cluster.stale_after_s,
                    cluster.incompatible(r.id)) for r in rows]


async def host_status(service: SandboxService, host_id: str) -> HostStatus:
    for status in await host_statuses(service):
        if status.id == host_id:
            return status
    raise ApiError(404, "not_found", f"host {host_id!r} not found")


async def set_draining(service: SandboxService, host_id: str, draining: bool) -> HostStatus:
    _cluster(service)
    if await asyncio.to_thread(service.store.set_draining, host_id, draining) is None:
        raise ApiError(404, "not_found", f"host {host_id!r} not found")
    return await host_status(service, host_id)


async def drain(service: SandboxService, host_id: str) -> DrainReport:
    """Mark the host draining (no new sandbox goes there), then move each of its running or
    paused sandboxes to another host. A sandbox that cannot move stays, running, where it
    is (`failed` says why); draining again retries it."""
    cluster = _cluster(service)
    await set_draining(service, host_id, True)
    report = DrainReport(host_id)
    rows = await asyncio.to_thread(service.store.live_sandboxes)
    for row in rows:
        if row.host_id != host_id:
            continue
        if row.state == "hibernated":
            report.stayed_hibernated.append(row.id)
            continue
        if row.state not in ("running", "paused"):
            continue
        try:
            report.moved[row.id], live = await move_how(service, cluster, row.id, host_id)
            if live:
                report.moved_live.append(row.id)
        except (ApiError, HostError) as exc:
            why = exc.message if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
            report.failed[row.id] = why
            log.warning("drain of %s: sandbox %s did not move: %s", host_id, row.id, why)
    return report


async def move(service: SandboxService, cluster: ClusterPool, sandbox_id: str,
               source: str) -> str:
    """Move one sandbox off `source` (see the module's docstring); the host it went to."""
    return (await move_how(service, cluster, sandbox_id, source))[0]


async def move_how(service: SandboxService, cluster: ClusterPool, sandbox_id: str,
                   source: str) -> tuple[str, bool]:
    """`move`, and whether the sandbox moved live."""
    row = service.store.sandbox_by_id(sandbox_id)
    if row is None:
        raise ApiError(404, "not_found", f"sandbox {sandbox_id!r} not found")
    was_paused = row.state == "paused"
    async with service.transition(sandbox_id):
        if not was_paused:
            try:
                target, _ = await migrate_live(cluster, sandbox_id, source,
                                               vcpus=row.vcpus, memory_mb=row.memory_mb)
            except HostError as exc:
                log.warning("sandbox %s did not move live off %s (%s: %s): moving it cold",
                            sandbox_id, source, type(exc).__name__, exc)
            else:
                service.store.update_sandbox(sandbox_id, host_id=target, state="running")
                log.info("sandbox %s moved live from %s to %s", sandbox_id, source, target)
                return target, True
        try:
            if was_paused:
                await cluster.resume(sandbox_id)
            await cluster.hibernate(sandbox_id)
        except HostError as exc:
            if was_paused:  # its row still says paused
                with contextlib.suppress(HostError):
                    await cluster.pause(sandbox_id)
            raise (api_error_of(exc) or exc) from None
        try:
            target = await cluster.wake_elsewhere(sandbox_id, vcpus=row.vcpus,
                                                  memory_mb=row.memory_mb, exclude=source)
        except HostError:
            # Nowhere to go: back where it was, as it was (its row still says so).
            await cluster.wake(sandbox_id)
            if was_paused:
                await cluster.pause(sandbox_id)
            raise
        try:
            await cluster.hosts[source].kill(sandbox_id)  # the source's copy (lease is gone)
        except SandboxNotFound:
            pass
        except HostError as exc:
            log.warning("sandbox %s moved to %s, but %s kept its copy: %s", sandbox_id,
                        target, source, exc)
        if was_paused:
            await cluster.pause(sandbox_id)
        service.store.update_sandbox(sandbox_id, host_id=target,
                                     state="paused" if was_paused else "running")
    log.info("sandbox %s moved from %s to %s", sandbox_id, source, target)
    return target, False


async def migrate_live(cluster: ClusterPool, sandbox_id: str, source: str, *,
                       vcpus: int, memory_mb: int) -> tuple[str, MigrationDocument]:
    """Live-migrate the running sandbox off `source` to the best other host that takes it;
    that host and the handoff (how long the sandbox paused). A failure before the switch
    leaves it running on `source` (both hosts undo their side) and raises; after the switch
    only the source's cleanup can fail (logged)."""
    src = cluster.hosts[source]
    if not isinstance(src, MigrationPort):
        raise HostError(f"host {source} does not migrate sandboxes")
    await cluster._ensure_fresh()
    offer = await src.offer_migration(sandbox_id)
    targets = [t for t in cluster._ranked(Shape(vcpus, memory_mb, ""))
               if t != source and isinstance(cluster.hosts.get(t), MigrationPort)]

    async def accept(target: str) -> MigrationDocument:
        dst = cluster.hosts[target]
        assert isinstance(dst, MigrationPort)
        return await dst.accept_migration(sandbox_id, offer)

    try:
        target, ticket = await first_taker(targets, accept, "no other host took the sandbox")
    except HostExhausted:
        with contextlib.suppress(HostError):
            await src.abort_migration(sandbox_id)
        raise
    dst = cluster.hosts[target]
    assert isinstance(dst, MigrationPort)
    try:
        handoff = await src.migrate(sandbox_id, ticket)
        await dst.complete_migration(sandbox_id, handoff)
    except BaseException:
        with contextlib.suppress(HostError):
            await dst.abort_migration(sandbox_id)
        with contextlib.suppress(HostError):
            await src.abort_migration(sandbox_id)
        raise
    cluster._sandboxes[sandbox_id] = _Held(target, vcpus, memory_mb)
    cluster._placed(target, vcpus, memory_mb)
    log.info("sandbox %s: paused %.0f ms of %.0f ms (%s, %d bytes of memory)", sandbox_id,
             float(handoff.get("downtime_ms", 0)), float(handoff.get("total_ms", 0)),
             handoff.get("method"), int(handoff.get("bytes", 0)))
    try:
        await src.release_migrated(sandbox_id)
    except HostError as exc:
        log.warning("sandbox %s moved live to %s, but %s kept its copy: %s", sandbox_id,
                    target, source, exc)
    return target, handoff
