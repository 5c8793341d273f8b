"""`LeasedHost`: a host port (the agent's `LocalHost`) whose sandboxes run only under leases
this host holds at its current epoch (membership.py says why).

- create takes the sandbox's lease before its VM starts (the id is made here when the caller
  gave none); fork children take theirs as they come (their ids are new, so no other host
  can run them meanwhile); a wake takes it before the VM is restored; kill releases it after
  the VM is gone (a lease left without a VM blocks nothing; a VM without a lease would).
- A refused lease (the host was fenced) raises HostUnavailable and leaves nothing behind. An
  operation that began under an epoch the agent no longer serves under kills what it made
  (the fence's kill may have looked before it existed).
- Every call first asks the membership whether the agent may serve: fenced or partitioned,
  it raises HostUnavailable (the host API's 503).
- `start()` starts the runtime (re-adopting its VMs), then joins the registry, which kills
  every VM that is not this host's, all before the host API serves anything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pandastack.hostport.errors import HostError, HostUnavailable, SandboxNotFound
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import (
    BuildLog,
    MigrationPort,
    RuntimePort,
    SandboxPlacement,
    SandboxPort,
    SnapshotTransferPort,
)
from pandastack.hostport.results import (
    BuildResult,
    MigrationDocument,
    SnapshotInfo,
    SnapshotResult,
    TransferDocument,
)
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.templatespec import TemplateSpec

from .membership import Membership

log = logging.getLogger("pandastack.registry")


def new_sandbox_id() -> str:
    return f"sbx-{secrets.token_hex(6)}"


@runtime_checkable
class FetchesHibernated(Protocol):
    """A host port that can lay out, without starting it, a sandbox another host hibernated
    into the object store (the agent's LocalHost with a store)."""

    async def fetch_hibernated(self, sandbox_id: str) -> None: ...


class LeasedHost:
    """`inner` is the agent's host port; `membership` its registration. `console_log` and
    the snapshot and build calls are passed through (behind the same check)."""

    def __init__(self, inner: RuntimePort, membership: Membership) -> None:
        self.inner = inner
        self.membership = membership

    async def start(self) -> None:
        await self.inner.start()
        await self.membership.join()
        self.membership.start()

    async def close(self) -> None:
        await self.membership.close()
        await self.inner.close()

    # -- what takes or drops a lease ------------------------------------------------------

    async def create(self, template: str = "base", *, vcpus: int = 1, memory_mb: int = 512,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = ()) -> SandboxPort:
        sid = sandbox_id or new_sandbox_id()
        epoch = await self.membership.lease(sid)
        try:
            sandbox = await self.inner.create(template, vcpus=vcpus, memory_mb=memory_mb,
                                              disk_mb=disk_mb, sandbox_id=sid,
                                              snapshot=snapshot, network=network,
                                              volumes=volumes)
        except BaseException:
            await self.membership.release(sid)
            raise
        await self._kept([sid], epoch)
        return sandbox

    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[SandboxPort]:
        _, epoch = self.membership.check()
        children = await self.inner.fork(sandbox_id, count)
        leased: list[str] = []
        try:
            for child in children:
                await self.membership.lease(child.id)
                leased.append(child.id)
        except BaseException:
            await self._undo([c.id for c in children], leased)
            raise
        await self._kept([c.id for c in children], epoch)
        return children

    async def wake(self, sandbox_id: str) -> None:
        self.membership.check()
        try:
            await self.inner.get(sandbox_id)  # SandboxNotFound before its lease is touched
        except SandboxNotFound:
            # Hibernated on another host: its files first (SandboxNotFound if the store has
            # none either), its lease next, its VM last.
            if not isinstance(self.inner, FetchesHibernated):
                raise
            await self.inner.fetch_hibernated(sandbox_id)
        epoch = await self.membership.lease(sandbox_id)
        await self.inner.wake(sandbox_id)
        await self._kept([sandbox_id], epoch)

    async def kill(self, sandbox_id: str) -> None:
        self.membership.check()
        await self.inner.kill(sandbox_id)
        await self.membership.release(sandbox_id)

    # Live migration: the destination takes the lease before the guest runs there; the
    # source drops it only while it still holds it, and takes it back when it runs on.

    def _migrations(self) -> MigrationPort:
        if not isinstance(self.inner, MigrationPort):
            raise HostError("this host does not migrate sandboxes")
        return self.inner

    async def complete_migration(self, sandbox_id: str, handoff: MigrationDocument) -> None:
        epoch = await self.membership.lease(sandbox_id)
        await self._migrations().complete_migration(sandbox_id, handoff)
        await self._kept([sandbox_id], epoch)

    async def release_migrated(self, sandbox_id: str) -> None:
        self.membership.check()
        await self._migrations().release_migrated(sandbox_id)
        await self.membership.release(sandbox_id)

    async def abort_migration(self, sandbox_id: str) -> None:
        self.membership.check()
        try:
            await self.inner.get(sandbox_id)
        except SandboxNotFound:  # the destination's side: no sandbox here yet
            await self._migrations().abort_migration(sandbox_id)
            await self.membership.release(sandbox_id)
            return
        await self.membership.lease(sandbox_id)
        await self._migrations().abort_migration(sandbox_id)

    async def offer_migration(self, sandbox_id: str) -> MigrationDocument:
        self.membership.check()
        return await self._migrations().offer_migration(sandbox_id)

    async def accept_migration(self, sandbox_id: str,
                               offer: MigrationDocument) -> MigrationDocument:
        self.membership.check()
        return await self._migrations().accept_migration(sandbox_id, offer)

    async def migrate(self, sandbox_id: str, ticket: MigrationDocument) -> MigrationDocument:
        self.membership.check()
        return await self._migrations().migrate(sandbox_id, ticket)

    # Snapshot transfers start no VM (the children are creates, with their leases).

    def _transfers(self) -> SnapshotTransferPort:
        if not isinstance(self.inner, SnapshotTransferPort):
            raise HostError("this host does not transfer snapshots")
        return self.inner

    async def offer_snapshot(self, sandbox_id: str) -> TransferDocument:
        self.membership.check()
        return await self._transfers().offer_snapshot(sandbox_id)

    async def accept_snapshot(self, offer: TransferDocument) -> TransferDocument:
        self.membership.check()
        return await self._transfers().accept_snapshot(offer)

    async def send_snapshot(self, snapshot_id: str, ticket: TransferDocument) -> None:
        self.membership.check()
        await self._transfers().send_snapshot(snapshot_id, ticket)

    async def _kept(self, sandbox_ids: list[str], epoch: int) -> None:
        """After an operation that made VMs under `epoch`: if the agent no longer serves
        under it, they are not its own; kill them and refuse."""
        if self.membership.still(epoch):
            return
        await self._undo(sandbox_ids, sandbox_ids)
        raise HostUnavailable(f"host {self.membership.host_id} was fenced or lost the "
                              f"registry while making {', '.join(sandbox_ids)}")

    async def _undo(self, made: list[str], leased: list[str]) -> None:
        for sid in made:
            with contextlib.suppress(HostError):
                await self.inner.kill(sid)
        for sid in leased:
            await self.membership.release(sid)

    # -- the rest: the same calls, once the membership allows -----------------------------

    async def prepare_template(self, name: str, *, vcpus: int = 1,
                               memory_mb: int = 512) -> None:
        self.membership.check()
        await self.inner.prepare_template(name, vcpus=vcpus, memory_mb=memory_mb)

    async def get(self, sandbox_id: str) -> SandboxPort:
        host_id, epoch = self.membership.check()
        sandbox = await self.inner.get(sandbox_id)
        if sandbox.state == "hibernated":
            # A guest call on a hibernated sandbox wakes it inside the runtime, past this
            # port's wake: let it only if the lease is still this host's (the control plane
            # may have woken the sandbox's saved state elsewhere).
            lease = await asyncio.to_thread(self.membership.registry.lease_of, sandbox_id)
            if lease is None or (lease.host_id, lease.epoch) != (host_id, epoch):
                raise HostUnavailable(f"the lease of {sandbox_id} is not this host's")
        return sandbox

    def handle(self, sandbox_id: str) -> SandboxPort:
        self.membership.check()
        return self.inner.handle(sandbox_id)

    async def list_sandboxes(self) -> Sequence[SandboxPort]:
        self.membership.check()
        return await self.inner.list_sandboxes()

    async def pause(self, sandbox_id: str) -> None:
        self.membership.check()
        await self.inner.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        self.membership.check()
        await self.inner.resume(sandbox_id)

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult:
        self.membership.check()
        return await self.inner.snapshot(sandbox_id, name, internal=internal)

    async def hibernate(self, sandbox_id: str) -> None:
        self.membership.check()
        await self.inner.hibernate(sandbox_id)

    async def update_network(self, sandbox_id: str, network: NetworkPolicy) -> NetworkPolicy:
        self.membership.check()
        return await self.inner.update_network(sandbox_id, network)

    async def placement(self, sandbox_id: str) -> SandboxPlacement:
        self.membership.check()
        return await self.inner.placement(sandbox_id)

    async def console_log(self, sandbox_id: str, max_bytes: int) -> bytes:
        self.membership.check()
        return await self.inner.console_log(sandbox_id, max_bytes)

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        self.membership.check()
        return await self.inner.snapshot_info(snapshot_id)

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        self.membership.check()
        return await self.inner.list_snapshots(include_internal=include_internal)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.membership.check()
        await self.inner.delete_snapshot(snapshot_id)

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None, vcpus: int = 1,
                             memory_mb: int = 512, cache_scope: str = "") -> BuildResult:
        self.membership.check()
        return await self.inner.build_template(spec, log=log, network=network, vcpus=vcpus,
                                               memory_mb=memory_mb, cache_scope=cache_scope)

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        self.membership.check()
        return await self.inner.prune_build_cache(keep_newest)

    def __getattr__(self, name: str) -> object:
        # What the inner port has beyond the port (and what the port gains later) passes
        # through behind the same check. An operation that starts a VM must be added above,
        # with its lease.
        if name in ("inner", "membership"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        self.membership.check()
        return getattr(self.inner, name)
