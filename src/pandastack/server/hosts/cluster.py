"""`ClusterPool`: the hosts the shared database's registry names, as one host port, for API
servers that keep no state of their own (`pandastack serve --db DSN --no-local-agent`; any
number of them side by side).

Where things are: the registry is the truth. A host is an agent that registered there and
heartbeats (pandastack.registry); a sandbox is where its lease says (the agent took it
before the VM started). Each server keeps a cache of both: hosts are re-read every
`refresh_s`, a sandbox's host is read from its lease on first use and again when the host
it was cached on says it does not have it (it moved: a wake on another host, a drain).

A host whose agent speaks a host API protocol this server cannot work with (a rolling
upgrade gone two levels apart: hostport/compat.py) is *incompatible*: it takes no sandbox,
and the hosts API says why; its sandboxes are still reached.

Liveness is the registry's too: a host whose last heartbeat (by the database's clock) is
older than `stale_after_s` is *stale*: it takes no sandbox. It is *lost* once this server
has also read the registry without a failure for `loss_grace_s` (default: the stale window)
since its last failed read: when the database itself was out, no agent could heartbeat,
and each must have had the time to do so again before its silence means anything (else an
outage of the database would fence every host and lose every sandbox). The first server to
see a host lost fences it (`fence`: its epoch and leases move on, so its heartbeats are
refused and, when it comes back, it kills the VMs it ran for them). A request for a
sandbox on a lost host raises `HostLost`; the service marks such rows `host_lost` and
offers the saved ones back (`wake` on another host, from the object store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, Protocol

from pandastack.hostport.compat import OURS, Levels, refusal
from pandastack.hostport.errors import (
    HostExhausted,
    HostLost,
    HostUnavailable,
    SandboxNotFound,
    SnapshotNotFound,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import RuntimePort, SandboxPort, SnapshotTransferPort
from pandastack.hostport.results import SnapshotInfo, TransferDocument
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS

from .pinning import pinned_host
from .placement import HostView, Shape, rank
from .pool import HostPool, _Held, first_taker

log = logging.getLogger("pandastack.server")

REFRESH_S = 2.0
#: The hosts a create tries, best first, before it answers that none took the sandbox (each
#: refusal is a host's own "exhausted": its reported usage was behind).
TRIES = 16
#: A fork onto another host in this context goes through the object store (a durable
#: snapshot the destination fetches) rather than straight from agent to agent (ADR 0024).
durable_fork: ContextVar[bool] = ContextVar("durable_fork", default=False)


class HostDirectory(Protocol):
    """What the pool reads and writes of the registry (the server's Store has all of it)."""

    def list_hosts(self) -> Sequence[Any]: ...
    def lease_of(self, sandbox_id: str) -> Any | None: ...
    def host_leases(self, host_id: str) -> Sequence[Any]: ...
    def db_time(self) -> float: ...
    def fence(self, host_id: str, *, epoch: int | None = None,
              older_than_seconds: float | None = None) -> int | None: ...


class ClusterPool(HostPool):
    """`connect(endpoint)` makes the port of the agent at an endpoint (a HostClient)."""

    def __init__(self, directory: HostDirectory, connect: Callable[[str], RuntimePort], *,
                 stale_after_s: float = 15.0, refresh_s: float = REFRESH_S,
                 loss_grace_s: float | None = None) -> None:
        super().__init__({}, require_hosts=False)
        self.directory = directory
        self.connect = connect
        self.stale_after_s = stale_after_s
        self.refresh_s = refresh_s
        self._rows: dict[str, Any] = {}
        self._views: dict[str, HostView] = {}  # as the hosts last reported, without pending
        self._refresher: asyncio.Task[None] | None = None
        self.loss_grace_s = stale_after_s if loss_grace_s is None else loss_grace_s
        self._stale: set[str] = set()
        self._lost: set[str] = set()
        self._incompatible: dict[str, str] = {}  # host -> why this server places nothing there
        # Since when (monotonic) every read of the registry succeeded; None after a failure.
        self._readable_since: float | None = None
        self._endpoints: dict[str, str] = {}
        self._refreshed_at = float("-inf")
        self._refresh_lock = asyncio.Lock()
        self._fenced: dict[str, int] = {}  # lost host -> the epoch this server fenced it to
        # Placed by this server since the host last reported its usage (counted until then):
        # vcpus, memory_mb, and the heartbeat time the host's report had when they were.
        self._pending: dict[str, tuple[int, int, float]] = {}

    # -- the registry ---------------------------------------------------------------------

    async def refresh(self, *, force: bool = False) -> None:
        """Re-read the hosts (at most every `refresh_s` unless `force`), connect to new ones
        and fence the ones that went stale."""
        if not force and time.monotonic() - self._refreshed_at < self.refresh_s:
            return
        async with self._refresh_lock:
            if not force and time.monotonic() - self._refreshed_at < self.refresh_s:
                return
            try:
                rows, now = await asyncio.to_thread(self._read)
            except Exception:
                self._readable_since = None
                raise
            if self._readable_since is None:
                self._readable_since = time.monotonic()
            self._apply(rows, now)
            for row in rows:
                if row.id in self._lost:
                    await asyncio.to_thread(self._fence_once, row)
            self._refreshed_at = time.monotonic()

    def _read(self) -> tuple[Sequence[Any], float]:
        return self.directory.list_hosts(), self.directory.db_time()

    def _apply(self, rows: Sequence[Any], now: float) -> None:
        # A host this server could not reach is tried again after each read: the registry
        # says whether it is alive; only a call says whether this server reaches it.
        self._unreachable.clear()
        for row in rows:
            if self._endpoints.get(row.id) != row.endpoint:
                old = self.hosts.get(row.id)
                if old is not None:
                    asyncio.get_running_loop().create_task(old.close())
                self.hosts[row.id] = self.connect(row.endpoint)
                self._endpoints[row.id] = row.endpoint
                self._unreachable.discard(row.id)
            self._rows[row.id] = row
            self._check_levels(row)
            if row.last_heartbeat_at < now - self.stale_after_s:
                self._stale.add(row.id)
                if row.id not in self._lost and self._past_grace():
                    log.warning("host %s (%s) stopped heartbeating: lost", row.id, row.endpoint)
                    self._lost.add(row.id)
            else:
                self._stale.discard(row.id)
                self._lost.discard(row.id)
                self._fenced.pop(row.id, None)
            self._templates.setdefault(row.id, set()).update(getattr(row, "templates", None)
                                                            or ())
            pending = self._pending.get(row.id)
            if pending is not None and row.last_heartbeat_at > pending[2]:
                self._pending.pop(row.id, None)  # the host's own count has them now
            self._views[row.id] = self._view(row)

    def _check_levels(self, row: Any) -> None:
        """Mark the host incompatible (or compatible again) by the levels it registered,
        logging each change once."""
        levels = Levels(int(getattr(row, "protocol", 1)), int(getattr(row, "oldest_protocol", 1)))
        reason = refusal(OURS, levels)
        if reason == self._incompatible.get(row.id):
            return
        if reason is None:
            self._incompatible.pop(row.id)
            log.info("host %s (%s, version %s) is compatible again: it takes sandboxes",
                     row.id, row.endpoint, row.version)
        else:
            self._incompatible[row.id] = reason
            log.warning("host %s (%s, version %s) is incompatible, no sandbox is placed "
                        "there: %s", row.id, row.endpoint, row.version, reason)

    def incompatible(self, host_id: str) -> str | None:
        """Why this server places no sandbox on the host (None: it may)."""
        return self._incompatible.get(host_id)

    def _fence_once(self, row: Any) -> None:
        """Fence a lost host once per loss: not one the registry says is fenced already (by
        another server, or by this one as it read the hosts before). The CAS on the epoch
        and the staleness keeps two fences from crossing, or one from hitting a host that
        heartbeat since. A host with no lease has nothing to fence."""
        if getattr(row, "fenced", False) or self._fenced.get(row.id) == row.epoch:
            return
        if not self.directory.host_leases(row.id):
            return
        epoch = self.directory.fence(row.id, epoch=row.epoch,
                                     older_than_seconds=self.stale_after_s)
        if epoch is not None:
            self._fenced[row.id] = epoch
            log.warning("host %s fenced: its leases moved to epoch %d", row.id, epoch)

    def _past_grace(self) -> bool:
        since = self._readable_since
        return since is not None and time.monotonic() - since >= self.loss_grace_s

    def lost_hosts(self) -> set[str]:
        return set(self._lost)

    def is_lost(self, host_id: str) -> bool:
        return host_id in self._lost

    # -- where things are -----------------------------------------------------------------

    def host_of(self, sandbox_id: str) -> str:
        held = self._sandboxes.get(sandbox_id)
        if held is None:
            lease = self.directory.lease_of(sandbox_id)
            if lease is None:
                raise SandboxNotFound(sandbox_id)
            held = self._sandboxes[sandbox_id] = _Held(lease.host_id)
        if held.host_id in self._lost:
            raise HostLost(f"sandbox {sandbox_id} was on host {held.host_id}, which stopped "
                           f"heartbeating")
        if held.host_id in self._stale:
            raise HostUnavailable(f"host {held.host_id} of sandbox {sandbox_id} has not "
                                  f"heartbeat for {self.stale_after_s:g} s")
        if held.host_id not in self.hosts:
            raise HostUnavailable(f"host {held.host_id} of sandbox {sandbox_id} is not "
                                  f"registered (yet)")
        return held.host_id

    def note_host(self, sandbox_id: str, host_id: str | None) -> None:
        """The host a fresh read of the sandbox's row names: a move by another API server
        (drain, wake elsewhere) updates the row, so a cache that a listing filled before the
        move would otherwise send guest calls, which do not retry, to the old host."""
        if host_id is None:
            return
        held = self._sandboxes.get(sandbox_id)
        if held is None or held.host_id != host_id:
            self._sandboxes[sandbox_id] = _Held(host_id, *(
                (held.vcpus, held.memory_mb) if held is not None else (0, 0)))

    def forget(self, sandbox_id: str) -> None:
        self._sandboxes.pop(sandbox_id, None)

    def _view(self, row: Any) -> HostView:
        return HostView(
            host_id=row.id, vcpus=row.vcpus, memory_mb=row.memory_mb,
            used_vcpus=int(row.used_vcpus or 0), used_memory_mb=int(row.used_memory_mb or 0),
            sandboxes=int(row.sandboxes or 0), labels=row.labels or {},
            templates=frozenset(self._templates.get(row.id, ())),
            live=row.id not in self._stale and row.id not in self._incompatible,
            draining=bool(row.draining))

    def views(self) -> list[HostView]:
        """The hosts as last read, with what this server placed since on top, and those it
        could not reach since marked so (both change between reads; the rest is cached)."""
        if not self._pending and not self._unreachable:
            return list(self._views.values())
        views = []
        for host_id, view in self._views.items():
            pending = self._pending.get(host_id)
            if pending is not None:
                view = replace(view, used_vcpus=view.used_vcpus + pending[0],
                               used_memory_mb=view.used_memory_mb + pending[1])
            if host_id in self._unreachable:
                view = replace(view, live=False)
            views.append(view)
        return views

    def _placed(self, host_id: str, vcpus: int, memory_mb: int) -> None:
        row = self._rows.get(host_id)
        since = row.last_heartbeat_at if row is not None else 0.0
        v, m, at = self._pending.get(host_id, (0, 0, since))
        self._pending[host_id] = (v + vcpus, m + memory_mb, at)

    def _live(self) -> list[str]:
        return [h for h in self.hosts if h not in self._stale]

    def _ranked(self, shape: Shape) -> list[str]:
        pinned = pinned_host.get()
        if pinned is not None:
            if pinned not in self._rows:
                raise HostExhausted(f"no host {pinned!r} is registered")
            if pinned in self._stale:
                raise HostExhausted(f"host {pinned} is not heartbeating")
            if pinned in self._incompatible:
                raise HostExhausted(f"host {pinned} is incompatible: "
                                    f"{self._incompatible[pinned]}")
            return [pinned]
        return [v.host_id for v in rank(self.views(), shape, limit=TRIES)]

    def _snapshot_host(self, snapshot_id: str) -> RuntimePort:
        """The host that made the snapshot if it is alive, else any live one: hosts that
        share the object store fetch a snapshot they do not hold."""
        host_id = self._snapshots.get(snapshot_id)
        if host_id is not None and host_id in self.hosts and host_id not in self._stale \
                and host_id not in self._unreachable:
            return self.hosts[host_id]
        live = [h for h in self._live() if h not in self._unreachable]
        if not live:
            raise HostUnavailable(f"no host is reachable for snapshot {snapshot_id}")
        return self.hosts[live[0]]

    # -- the port -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh(force=True)
        if not self._live():
            log.warning("no live host is registered in the database yet")
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_loop(),
                                                  name="pandastack-host-registry")

    async def _refresh_loop(self) -> None:
        """Re-read the hosts every `refresh_s` off the request path (a create only ranks
        what was read)."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh(force=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("reading the host registry failed: %s",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        await super().close()

    async def _ensure_fresh(self) -> None:
        """Refresh if the background reads have fallen behind (never run, or stuck); while
        the database is out of reach, go on with the hosts last read."""
        if time.monotonic() - self._refreshed_at < max(5 * self.refresh_s, 1.0):
            return
        try:
            await self.refresh()
        except Exception as exc:
            if not self._rows:
                raise HostUnavailable(f"the host registry cannot be read: {exc}") from exc
            log.warning("the host registry cannot be read, using the hosts last read: %s",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    async def create(self, template: str = DEFAULT_TEMPLATE, *, vcpus: int = DEFAULT_VCPUS,
                     memory_mb: int = DEFAULT_MEMORY_MB,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = ()) -> SandboxPort:
        await self._ensure_fresh()
        return await super().create(template, vcpus=vcpus, memory_mb=memory_mb,
                                    disk_mb=disk_mb, sandbox_id=sandbox_id, snapshot=snapshot,
                                    network=network, volumes=volumes)

    def _create_candidates(self, template: str, vcpus: int, memory_mb: int,
                           snapshot: str | None) -> list[str]:
        """Ranked as any create: every host sharing the object store can restore a snapshot,
        but the one that holds it comes first (no fetch) unless the create is pinned."""
        candidates = self._ranked(Shape(vcpus, memory_mb, template))
        if snapshot is not None and pinned_host.get() is None:
            holder = self._snapshots.get(snapshot)
            if holder in candidates:
                candidates.remove(holder)
                candidates.insert(0, holder)
        return candidates

    async def prepare_template(self, name: str, *, vcpus: int = DEFAULT_VCPUS,
                               memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        await self._ensure_fresh()
        await super().prepare_template(name, vcpus=vcpus, memory_mb=memory_mb)

    async def get(self, sandbox_id: str) -> SandboxPort:
        found: SandboxPort = await self._moved(sandbox_id, lambda host: host.get(sandbox_id))
        return found

    async def _moved(self, sandbox_id: str, call: Callable[[RuntimePort], Any]) -> Any:
        """`call` on the sandbox's host; once more on the host its lease names now if the
        cached one says it does not have it (it moved since it was cached)."""
        try:
            return await call(self._host(sandbox_id))
        except SandboxNotFound:
            cached = self._sandboxes.pop(sandbox_id, None)
            lease = await asyncio.to_thread(self.directory.lease_of, sandbox_id)
            if lease is None or cached is None or lease.host_id == cached.host_id:
                raise
            return await call(self._host(sandbox_id))

    async def list_sandboxes(self) -> Sequence[SandboxPort]:
        """The sandboxes of every live host (a lost host's are the service's to mark)."""
        await self._ensure_fresh()
        sandboxes, _, lost = await self._each(self._live())
        if lost:
            raise HostUnavailable(f"hosts out of reach: {', '.join(lost)}")
        return sandboxes

    async def kill(self, sandbox_id: str) -> None:
        """A lost host's sandbox has no VM to kill here: the host kills it when it comes
        back (its lease is fenced). What it saved in the object store (a hibernation) is
        deleted through a live host, which holds no copy of it: the sandbox has ended."""
        try:
            await self._moved(sandbox_id, lambda host: host.kill(sandbox_id))
        except HostLost:
            live = [h for h in self._live() if h not in self._unreachable]
            if live:
                with contextlib.suppress(SandboxNotFound, HostUnavailable):
                    await self.hosts[live[0]].kill(sandbox_id)
            raise SandboxNotFound(sandbox_id) from None
        finally:
            self._sandboxes.pop(sandbox_id, None)

    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[SandboxPort]:
        """On the parent's host when it has room (and no other host is pinned); else onto
        the best other host: its state streamed there from the parent's host (ADR 0024),
        or, where that cannot be (or `durable_fork` asks), through a durable snapshot in
        the object store."""
        await self._ensure_fresh()
        source = self.host_of(sandbox_id)
        held = self._sandboxes[sandbox_id]
        pinned = pinned_host.get()
        if pinned is None or pinned == source:
            try:
                children = await self.hosts[source].fork(sandbox_id, count)
            except HostExhausted:
                if pinned is not None:
                    raise
            else:
                for child in children:
                    self._sandboxes[child.id] = _Held(source, held.vcpus, held.memory_mb)
                return children
        return await self._fork_elsewhere(sandbox_id, source, count)

    async def _fork_elsewhere(self, sandbox_id: str, source: str,
                              count: int) -> list[SandboxPort]:
        if not durable_fork.get():
            direct = await self._fork_direct(sandbox_id, source, count)
            if direct is not None:
                return direct
        result = await self.hosts[source].snapshot(sandbox_id, internal=True)
        info = result.info
        shape = Shape(info.vcpus, info.memory_mb, info.template)
        children: list[SandboxPort] = []
        try:
            for _ in range(count):
                children.append(await self._create_from(info, shape, exclude=source))
        except BaseException:
            for child in children:
                try:
                    await self.kill(child.id)
                except Exception:
                    log.exception("removing fork child %s after a failed fork", child.id)
            raise
        finally:
            try:
                await self.delete_snapshot(info.id)  # and the copies the children's hosts got
            except Exception as exc:
                log.warning("deleting the fork snapshot %s: %s", info.id, exc)
        return children

    async def _fork_direct(self, sandbox_id: str, source: str,
                           count: int) -> list[SandboxPort] | None:
        """The fork's snapshot streamed from the source to the best other host that takes
        it, the children made there; None where no such pair is (a host that cannot
        transfer, none live), so that the caller goes through the object store."""
        src = self.hosts[source]
        held = self._sandboxes[sandbox_id]
        shape = Shape(held.vcpus or 1, held.memory_mb or 512, "")
        targets = [h for h in self._ranked(shape) if (h != source or pinned_host.get() ==
                                                      source) and h not in self._unreachable
                   and isinstance(self.hosts[h], SnapshotTransferPort)]
        if not isinstance(src, SnapshotTransferPort) or not targets:
            return None
        offer = await src.offer_snapshot(sandbox_id)
        snap_id = str(offer["snapshot"]["id"])
        vcpus, memory_mb = int(offer["snapshot"]["vcpus"]), int(offer["snapshot"]["memory_mb"])
        template = str(offer["snapshot"]["template"])
        used: list[str] = []

        async def accept(host_id: str) -> TransferDocument:
            dst = self.hosts[host_id]
            assert isinstance(dst, SnapshotTransferPort)
            return await dst.accept_snapshot(offer)

        try:
            host_id, ticket = await first_taker(targets, accept, "no other host took the fork")
            used.append(host_id)
            await src.send_snapshot(snap_id, ticket)
            return await self._children_on(host_id, snap_id, template, vcpus, memory_mb, count)
        finally:
            # Transient on both: each deletes its own copy only (no store request).
            for host_id in (source, *used):
                try:
                    await self.hosts[host_id].delete_snapshot(snap_id)
                except SnapshotNotFound:
                    pass
                except Exception as exc:
                    log.warning("deleting the fork snapshot %s on %s: %s", snap_id, host_id,
                                exc)

    async def _children_on(self, host_id: str, snapshot_id: str, template: str, vcpus: int,
                           memory_mb: int, count: int) -> list[SandboxPort]:
        results = await asyncio.gather(*(self.hosts[host_id].create(
            template, snapshot=snapshot_id) for _ in range(count)), return_exceptions=True)
        children = [r for r in results if not isinstance(r, BaseException)]
        for child in children:
            self._sandboxes[child.id] = _Held(host_id, vcpus, memory_mb)
            self._placed(host_id, vcpus, memory_mb)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for child in children:
                try:
                    await self.kill(child.id)
                except Exception:
                    log.exception("removing fork child %s after a failed fork", child.id)
            raise failures[0]
        return children

    async def _create_from(self, info: SnapshotInfo, shape: Shape, *,
                           exclude: str) -> SandboxPort:
        candidates = [h for h in self._ranked(shape) if h != exclude or
                      pinned_host.get() == exclude]
        host_id, child = await first_taker(
            candidates, lambda h: self.hosts[h].create(info.template, snapshot=info.id),
            "no other host took the fork", none_fits=": none fits")
        self._sandboxes[child.id] = _Held(host_id, info.vcpus, info.memory_mb)
        self._placed(host_id, info.vcpus, info.memory_mb)
        return child

    async def wake(self, sandbox_id: str) -> None:
        """On its host; if that host is lost, on the best live one, which restores the state
        the hibernation saved in the object store (SandboxNotFound if none was saved)."""
        try:
            await self._moved(sandbox_id, lambda host: host.wake(sandbox_id))
        except HostLost:
            await self.wake_elsewhere(sandbox_id)

    async def wake_elsewhere(self, sandbox_id: str, *, vcpus: int = DEFAULT_VCPUS,
                             memory_mb: int = DEFAULT_MEMORY_MB,
                             exclude: str | None = None) -> str:
        """Wake a sandbox saved in the object store on another host; the host it went to."""
        await self._ensure_fresh()
        lease = await asyncio.to_thread(self.directory.lease_of, sandbox_id)
        away = {exclude} if exclude else set()
        if lease is not None:
            away.add(lease.host_id)
        host_id, _ = await first_taker(
            (h for h in self._ranked(Shape(vcpus, memory_mb, "")) if h not in away),
            lambda h: self.hosts[h].wake(sandbox_id), "no live host took the sandbox")
        self._sandboxes[sandbox_id] = _Held(host_id, vcpus, memory_mb)
        self._placed(host_id, vcpus, memory_mb)
        return host_id

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        await self._ensure_fresh()
        _, snapshots, lost = await self._each(self._live())
        if lost:
            raise HostUnavailable(f"hosts out of reach: {', '.join(lost)}")
        return [s for s in snapshots if include_internal or not s.internal]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """On every live host: any that created from it holds a copy it fetched (and the
        one holding the manifest deletes that too). SnapshotNotFound if none had it."""
        await self._ensure_fresh()
        live = [h for h in self._live() if h not in self._unreachable]
        if not live:
            raise HostUnavailable(f"no host is reachable for snapshot {snapshot_id}")
        results = await asyncio.gather(*(self.hosts[h].delete_snapshot(snapshot_id)
                                         for h in live), return_exceptions=True)
        self._snapshots.pop(snapshot_id, None)
        found = False
        for result in results:
            if result is None:
                found = True
            elif not isinstance(result, SnapshotNotFound):
                raise result
        if not found:
            raise SnapshotNotFound(snapshot_id)

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        await self._ensure_fresh()
        self._unreachable.update(self._stale)  # skipped below, like one out of reach
        try:
            return await super().prune_build_cache(keep_newest)
        finally:
            self._unreachable.difference_update(self._stale)

