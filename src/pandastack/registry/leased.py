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

from pandastack.hostport.errors import (
    HostError,
    HostUnavailable,
    SandboxNotFound,
    VolumeNotFound,
)
from pandastack.hostport.forwarding import Forwarded, PortCall
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import (
    MigrationPort,
    RuntimePort,
    SandboxPort,
    SnapshotTransferPort,
)
from pandastack.hostport.results import MigrationDocument
from pandastack.hostport.volumes import VolumeMountRequest, VolumePort
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS

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

    async def create(self, template: str = DEFAULT_TEMPLATE, *, vcpus: int = DEFAULT_VCPUS,
                     memory_mb: int = DEFAULT_MEMORY_MB,
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

    def _transfers(self) -> SnapshotTransferPort:
        if not isinstance(self.inner, SnapshotTransferPort):
            raise HostError("this host does not transfer snapshots")
        return self.inner

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

    # -- the rest: the same calls, to the inner port once the membership allows ------------

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

    prepare_template = Forwarded(RuntimePort.prepare_template)
    handle = Forwarded(RuntimePort.handle)
    list_sandboxes = Forwarded(RuntimePort.list_sandboxes)
    pause = Forwarded(RuntimePort.pause)
    resume = Forwarded(RuntimePort.resume)
    snapshot = Forwarded(RuntimePort.snapshot)
    hibernate = Forwarded(RuntimePort.hibernate)
    update_network = Forwarded(RuntimePort.update_network)
    placement = Forwarded(RuntimePort.placement)
    console_log = Forwarded(RuntimePort.console_log)
    snapshot_info = Forwarded(RuntimePort.snapshot_info)
    list_snapshots = Forwarded(RuntimePort.list_snapshots)
    delete_snapshot = Forwarded(RuntimePort.delete_snapshot)
    build_template = Forwarded(RuntimePort.build_template)
    prune_build_cache = Forwarded(RuntimePort.prune_build_cache)
    inspect_image = Forwarded(RuntimePort.inspect_image)
    # The inner port's migrations that start or end no VM here (those above take leases).
    offer_migration = Forwarded(MigrationPort.offer_migration)
    accept_migration = Forwarded(MigrationPort.accept_migration)
    migrate = Forwarded(MigrationPort.migrate)
    # Snapshot transfers start no VM (the children are creates, with their leases).
    offer_snapshot = Forwarded(SnapshotTransferPort.offer_snapshot)
    accept_snapshot = Forwarded(SnapshotTransferPort.accept_snapshot)
    send_snapshot = Forwarded(SnapshotTransferPort.send_snapshot)
    # Volumes start no VM either.
    create_volume = Forwarded(VolumePort.create_volume)
    get_volume = Forwarded(VolumePort.get_volume)
    list_volumes = Forwarded(VolumePort.list_volumes)
    resize_volume = Forwarded(VolumePort.resize_volume)
    delete_volume = Forwarded(VolumePort.delete_volume)
    backup_volume = Forwarded(VolumePort.backup_volume)
    restore_volume = Forwarded(VolumePort.restore_volume)
    delete_volume_backup = Forwarded(VolumePort.delete_volume_backup)

    def forward_target(self, call: PortCall) -> object:
        """The inner port, once the membership allows, as the port the call belongs to."""
        self.membership.check()
        if call.port is MigrationPort:
            return self._migrations()
        if call.port is SnapshotTransferPort:
            return self._transfers()
        if call.port is VolumePort and not isinstance(self.inner, VolumePort):
            raise VolumeNotFound("this host keeps no volumes")
        return self.inner

    def __getattr__(self, name: str) -> object:
        # What the inner port has beyond the port passes through behind the same check. A
        # method the port gains must be named above (tests/registry/test_leased_forwarding.py
        # fails until it is): forwarded, or written out with its lease if it starts a VM.
        if name in ("inner", "membership"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        self.membership.check()
        return getattr(self.inner, name)
