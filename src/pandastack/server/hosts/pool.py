"""`HostPool`: many hosts as one host port. The service above it is unchanged: it asks the
pool, and the pool sends each call to the host that holds the sandbox (or snapshot), and a
create to the best host that takes it (`placement.rank`; a host that answers HostExhausted
or cannot be reached is skipped for the next).

Where things are: the hosts are the truth. `start()` asks every host what it runs and
holds; every create, fork, snapshot and kill keeps that map current. A host that cannot be
reached makes `list_sandboxes()` raise HostUnavailable (naming it) rather than answer
without its sandboxes: the control plane's reconcile would otherwise end them as gone.

Not yet (issue 17): a lease table and fencing in a shared store, capacity reported by the
agents, and cross-host snapshots through an object store (today a sandbox made from a
snapshot, or a fork, goes to the host that holds the snapshot or the parent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pandastack.hostport.errors import (
    HostExhausted,
    HostUnavailable,
    SandboxNotFound,
    SnapshotNotFound,
)
from pandastack.hostport.forwarding import Forwarded, PortCall
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import BuildLog, RuntimePort, SandboxPort
from pandastack.hostport.registries import RegistryLogins
from pandastack.hostport.results import BuildResult, ImageInfo, SnapshotInfo, SnapshotResult
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS
from pandastack.templatespec import TemplateSpec

from .placement import HostView, Shape, rank
from .volume_routing import VolumeRouting

log = logging.getLogger("pandastack.server")


T = TypeVar("T")


async def first_taker(candidates: Iterable[str], attempt: Callable[[str], Awaitable[T]],
                      refused: str, *, unreachable: set[str] | None = None,
                      none_fits: str = "") -> tuple[str, T]:
    """The first of `candidates` (host ids, best first) whose `attempt` succeeds, and what it
    returned. A host that answers HostExhausted, or cannot be reached, is passed over for the
    next (into `unreachable`, where given); when none takes it, HostExhausted says `refused`
    and why each host did not (`none_fits` when there was no candidate)."""
    tried: list[str] = []
    for host_id in candidates:
        try:
            return host_id, await attempt(host_id)
        except HostUnavailable as exc:
            if unreachable is None:
                tried.append(f"{host_id}: {exc}")
            else:
                unreachable.add(host_id)
                tried.append(f"{host_id}: out of reach")
        except HostExhausted as exc:
            tried.append(f"{host_id}: {exc}")
    raise HostExhausted(refused + (f" ({'; '.join(tried)})" if tried else none_fits))


@dataclass
class _Held:
    host_id: str
    vcpus: int = 0
    memory_mb: int = 0


class HostPool(VolumeRouting):
    """`hosts`: host id -> its port (a HostClient per agent, or one in-process host)."""

    def __init__(self, hosts: Mapping[str, RuntimePort], *, require_hosts: bool = True) -> None:
        if require_hosts and not hosts:
            raise ValueError("a host pool needs at least one host")
        self.hosts = dict(hosts)
        self._sandboxes: dict[str, _Held] = {}
        self._snapshots: dict[str, str] = {}
        self._volume_hosts: dict[str, str] = {}
        self._templates: dict[str, set[str]] = {host_id: set() for host_id in self.hosts}
        self._unreachable: set[str] = set()

    # -- where things are -----------------------------------------------------------------

    def host_of(self, sandbox_id: str) -> str:
        """The host that holds the sandbox. One the pool does not know is on no host, unless
        a host is out of reach: then it may be there (HostUnavailable, never "gone")."""
        held = self._sandboxes.get(sandbox_id)
        if held is not None:
            return held.host_id
        if self._unreachable:
            raise HostUnavailable(f"sandbox {sandbox_id} may be on a host out of reach "
                                  f"({', '.join(sorted(self._unreachable))})")
        raise SandboxNotFound(sandbox_id)

    def _host(self, sandbox_id: str) -> RuntimePort:
        return self.hosts[self.host_of(sandbox_id)]

    def _snapshot_host(self, snapshot_id: str) -> RuntimePort:
        return self.hosts[self._snapshot_host_id(snapshot_id)]

    def _snapshot_host_id(self, snapshot_id: str) -> str:
        host_id = self._snapshots.get(snapshot_id)
        if host_id is not None:
            return host_id
        if self._unreachable:
            raise HostUnavailable(f"snapshot {snapshot_id} may be on a host out of reach "
                                  f"({', '.join(sorted(self._unreachable))})")
        raise SnapshotNotFound(snapshot_id)

    def views(self) -> list[HostView]:
        counts: dict[str, list[int]] = {h: [0, 0, 0] for h in self.hosts}
        for held in self._sandboxes.values():
            c = counts[held.host_id]
            c[0] += 1
            c[1] += held.vcpus
            c[2] += held.memory_mb
        return [HostView(host_id=h, sandboxes=n, used_vcpus=v, used_memory_mb=m,
                         templates=frozenset(self._templates[h]),
                         live=h not in self._unreachable)
                for h, (n, v, m) in counts.items()]

    async def _learn(self, host_id: str) -> tuple[Sequence[SandboxPort], list[SnapshotInfo]]:
        """Ask one host what it runs and holds, and remember it (raises HostUnavailable)."""
        host = self.hosts[host_id]
        # Only what was known before the listing began may be dropped for its absence: a
        # create or fork that finished while the listing was under way is not in it.
        before = {sid for sid, held in self._sandboxes.items() if held.host_id == host_id}
        sandboxes = await host.list_sandboxes()
        snapshots = await host.list_snapshots(include_internal=True)
        listed = {sandbox.id for sandbox in sandboxes}
        for sid in before - listed:
            held = self._sandboxes.get(sid)
            if held is not None and held.host_id == host_id:
                del self._sandboxes[sid]
        for sandbox in sandboxes:  # keep the shape a create here recorded
            held = self._sandboxes.get(sandbox.id)
            if held is None or held.host_id != host_id:
                self._sandboxes[sandbox.id] = _Held(host_id)
        for info in snapshots:
            self._snapshots[info.id] = host_id
            self._templates[host_id].add(info.template)
        self._unreachable.discard(host_id)
        return sandboxes, snapshots

    async def _each(self, names: Sequence[str] | None = None
                    ) -> tuple[list[SandboxPort], list[SnapshotInfo], list[str]]:
        """Learn from every host (or `names`) at once: their sandboxes and snapshots, and the
        ids of those out of reach."""
        names = list(self.hosts) if names is None else list(names)
        results = await asyncio.gather(*(self._learn(h) for h in names), return_exceptions=True)
        sandboxes: list[SandboxPort] = []
        snapshots: list[SnapshotInfo] = []
        lost: list[str] = []
        for host_id, result in zip(names, results, strict=True):
            if isinstance(result, HostUnavailable):
                self._unreachable.add(host_id)
                lost.append(host_id)
            elif isinstance(result, BaseException):
                raise result
            else:
                sandboxes.extend(result[0])
                snapshots.extend(result[1])
        return sandboxes, snapshots, lost

    # -- the port ---------------------------------------------------------------------------

    # Calls on one sandbox (or snapshot) go to the host that holds it, unchanged.
    get = Forwarded(RuntimePort.get)
    handle = Forwarded(RuntimePort.handle)
    pause = Forwarded(RuntimePort.pause)
    resume = Forwarded(RuntimePort.resume)
    hibernate = Forwarded(RuntimePort.hibernate)
    wake = Forwarded(RuntimePort.wake)
    update_network = Forwarded(RuntimePort.update_network)
    placement = Forwarded(RuntimePort.placement)
    console_log = Forwarded(RuntimePort.console_log)
    snapshot_info = Forwarded(RuntimePort.snapshot_info)

    def forward_target(self, call: PortCall) -> RuntimePort:
        if call.subject == "sandbox_id":
            return self._host(call.key)
        if call.subject == "snapshot_id":
            return self._snapshot_host(call.key)
        raise TypeError(f"a pool of hosts does not route {call.name} by {call.subject!r}")

    async def start(self) -> None:
        results = await asyncio.gather(*(h.start() for h in self.hosts.values()),
                                       return_exceptions=True)
        for host_id, result in zip(self.hosts, results, strict=True):
            if isinstance(result, HostUnavailable):
                log.warning("host %s is out of reach at start: %s", host_id, result)
                self._unreachable.add(host_id)
            elif isinstance(result, BaseException):
                raise result
        await self._each([h for h in self.hosts if h not in self._unreachable])
        if len(self._unreachable) == len(self.hosts):
            raise HostUnavailable(f"no host of the pool answers ({', '.join(self.hosts)})")

    async def close(self) -> None:
        await asyncio.gather(*(h.close() for h in self.hosts.values()), return_exceptions=True)

    async def create(self, template: str = DEFAULT_TEMPLATE, *, vcpus: int = DEFAULT_VCPUS,
                     memory_mb: int = DEFAULT_MEMORY_MB,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = ()) -> SandboxPort:
        # A sandbox with volumes runs where they live (the control plane keeps them on one).
        candidates = [await self.volume_host(volumes[0].volume_id)] if volumes else \
            self._create_candidates(template, vcpus, memory_mb, snapshot)
        host_id, sandbox = await first_taker(
            candidates,
            lambda h: self.hosts[h].create(
                template, vcpus=vcpus, memory_mb=memory_mb, disk_mb=disk_mb,
                sandbox_id=sandbox_id, snapshot=snapshot, network=network, volumes=volumes),
            "no host took the sandbox", unreachable=self._unreachable, none_fits=": none fits")
        self._sandboxes[sandbox.id] = _Held(host_id, vcpus, memory_mb)
        self._templates.setdefault(host_id, set()).add(template)
        self._placed(host_id, vcpus, memory_mb)
        return sandbox

    def _create_candidates(self, template: str, vcpus: int, memory_mb: int,
                           snapshot: str | None) -> list[str]:
        """The hosts a create tries, best first: a snapshot's own host (it is there only)."""
        if snapshot is not None:
            return [self._snapshot_host_id(snapshot)]
        return [v.host_id for v in rank(self.views(), Shape(vcpus, memory_mb, template))]

    def _placed(self, host_id: str, vcpus: int, memory_mb: int) -> None:
        """A sandbox of this shape was just placed on `host_id` (the pool counts it from its
        own map; a pool that counts from the hosts' reports keeps it until the next one)."""

    async def prepare_template(self, name: str, *, vcpus: int = DEFAULT_VCPUS,
                               memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        """On every reachable host (each builds a built-in template on its first use)."""
        live = [h for h in self.hosts if h not in self._unreachable]
        results = await asyncio.gather(
            *(self.hosts[h].prepare_template(name, vcpus=vcpus, memory_mb=memory_mb)
              for h in live), return_exceptions=True)
        for host_id, result in zip(live, results, strict=True):
            if isinstance(result, HostUnavailable):
                self._unreachable.add(host_id)
            elif isinstance(result, BaseException):
                raise result
            else:
                self._templates[host_id].add(name)

    async def list_sandboxes(self) -> Sequence[SandboxPort]:
        sandboxes, _, lost = await self._each()
        if lost:
            raise HostUnavailable(f"hosts out of reach: {', '.join(lost)}")
        return sandboxes

    async def kill(self, sandbox_id: str) -> None:
        try:
            await self._host(sandbox_id).kill(sandbox_id)
        except SandboxNotFound:
            self._sandboxes.pop(sandbox_id, None)
            raise
        self._sandboxes.pop(sandbox_id, None)

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult:
        host_id = self.host_of(sandbox_id)
        result = await self.hosts[host_id].snapshot(sandbox_id, name, internal=internal)
        self._snapshots[result.info.id] = host_id
        return result

    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[SandboxPort]:
        held = self._sandboxes.get(sandbox_id)
        if held is None:
            raise SandboxNotFound(sandbox_id)
        children = await self.hosts[held.host_id].fork(sandbox_id, count)
        for child in children:
            self._sandboxes[child.id] = _Held(held.host_id, held.vcpus, held.memory_mb)
        return children

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        _, snapshots, lost = await self._each()
        if lost:
            raise HostUnavailable(f"hosts out of reach: {', '.join(lost)}")
        return [s for s in snapshots if include_internal or not s.internal]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._snapshot_host(snapshot_id).delete_snapshot(snapshot_id)
        self._snapshots.pop(snapshot_id, None)

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None,
                             vcpus: int = DEFAULT_VCPUS, memory_mb: int = DEFAULT_MEMORY_MB,
                             cache_scope: str = "",
                             registry_logins: RegistryLogins | None = None) -> BuildResult:
        """On the best host for the build's VM; the template's snapshot stays there."""
        ranked = rank(self.views(), Shape(vcpus, memory_mb, spec.from_template))
        if not ranked:
            raise HostExhausted("no host can take the build's VM")
        host_id = ranked[0].host_id
        result = await self.hosts[host_id].build_template(
            spec, log=log, network=network, vcpus=vcpus, memory_mb=memory_mb,
            cache_scope=cache_scope, registry_logins=registry_logins)
        self._snapshots[result.snapshot_id] = host_id
        return result

    async def inspect_image(self, reference: str, *,
                            registry_logins: RegistryLogins | None = None) -> ImageInfo:
        """Asked of a reachable host (the hosts pull with the same operator settings), the
        next one when it is out of reach."""
        for host_id in [h for h in self.hosts if h not in self._unreachable]:
            try:
                return await self.hosts[host_id].inspect_image(
                    reference, registry_logins=registry_logins)
            except HostUnavailable:
                self._unreachable.add(host_id)
        raise HostUnavailable("no host answers to look the image up")

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        deleted: list[str] = []
        for host_id, host in self.hosts.items():
            if host_id in self._unreachable:
                continue
            for sid in await host.prune_build_cache(keep_newest):
                self._snapshots.pop(sid, None)
                deleted.append(sid)
        return deleted
