"""`LocalHost`: this host's runtime and template builds as the host port
(`pandastack.hostport.protocols.RuntimePort`). The control plane composes one in its own
process on a single machine; the `pandastack agent` process serves one over the host API.

A live `SandboxHandle` already is a `SandboxPort`; what this adds is the async face of the
runtime's synchronous lookups and its files (the console log), so the same calls work for a
host in another process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import BuildLog, SandboxPlacement, SandboxPort
from pandastack.hostport.registries import RegistryLogins
from pandastack.hostport.results import (
    BuildResult,
    ImageInfo,
    MigrationDocument,
    SnapshotInfo,
    SnapshotResult,
    TransferDocument,
)
from pandastack.hostport.volumes import HostVolume, VolumeBackup, VolumeMountRequest
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS
from pandastack.templatespec import TemplateSpec
from pandastack.tracing import traced

from .runtime import HostRuntime
from .templates.builds import TemplateBuilds
from .templates.image_base import inspect_image
from .volumes.backup import VolumeBackups


class LocalHost:
    """With `owns_runtime` false, `close()` leaves the runtime running (its caller owns it)."""

    def __init__(self, runtime: HostRuntime, *, owns_runtime: bool = True,
                 migration_host: str = "127.0.0.1") -> None:
        """`migration_host`: the address of this host where the memory of a sandbox that
        migrates here arrives (the agent's own address on its network)."""
        self.runtime = runtime
        self.migration_host = migration_host
        self.builds = TemplateBuilds(runtime)
        self.owns_runtime = owns_runtime

    async def start(self) -> None:
        await self.runtime.start()

    async def close(self) -> None:
        if self.owns_runtime:
            await self.runtime.close()

    @traced("host.create")
    async def create(self, template: str = DEFAULT_TEMPLATE, *, vcpus: int = DEFAULT_VCPUS,
                     memory_mb: int = DEFAULT_MEMORY_MB,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = ()) -> SandboxPort:
        return await self.runtime.create(template, vcpus=vcpus, memory_mb=memory_mb,
                                         disk_mb=disk_mb, sandbox_id=sandbox_id,
                                         snapshot=snapshot, network=network, volumes=volumes)

    # -- volumes (VolumePort) ---------------------------------------------------------------

    async def create_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        return await self.runtime.volumes.create(volume_id, size_mb)

    async def get_volume(self, volume_id: str) -> HostVolume:
        return await self.runtime.volumes.get(volume_id)

    async def list_volumes(self) -> Sequence[HostVolume]:
        return await self.runtime.volumes.all()

    async def resize_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        return await self.runtime.volumes.resize(volume_id, size_mb)

    async def delete_volume(self, volume_id: str) -> None:
        await self.runtime.volumes.delete(volume_id)

    def _backups(self) -> VolumeBackups:
        return VolumeBackups(self.runtime.volumes, self.runtime.remote)

    async def backup_volume(self, volume_id: str, backup_id: str) -> VolumeBackup:
        return await self._backups().backup(volume_id, backup_id)

    async def restore_volume(self, backup_id: str, volume_id: str) -> HostVolume:
        return await self._backups().restore(backup_id, volume_id)

    async def delete_volume_backup(self, backup_id: str) -> None:
        await self._backups().delete(backup_id)

    async def prepare_template(self, name: str, *, vcpus: int = DEFAULT_VCPUS,
                               memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        await self.runtime.prepare_template(name, vcpus=vcpus, memory_mb=memory_mb)

    async def get(self, sandbox_id: str) -> SandboxPort:
        return self.runtime.get(sandbox_id)

    def handle(self, sandbox_id: str) -> SandboxPort:
        return self.runtime.get(sandbox_id)

    async def list_sandboxes(self) -> Sequence[SandboxPort]:
        return self.runtime.list()

    async def kill(self, sandbox_id: str) -> None:
        await self.runtime.kill(sandbox_id)

    async def pause(self, sandbox_id: str) -> None:
        await self.runtime.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        await self.runtime.resume(sandbox_id)

    @traced("host.snapshot")
    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult:
        return await self.runtime.snapshot(sandbox_id, name, internal=internal)

    @traced("host.fork")
    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[SandboxPort]:
        return await self.runtime.fork(sandbox_id, count)

    @traced("host.hibernate")
    async def hibernate(self, sandbox_id: str) -> None:
        await self.runtime.hibernate(sandbox_id)

    @traced("host.wake")
    async def wake(self, sandbox_id: str) -> None:
        await self.runtime.wake(sandbox_id)

    async def fetch_hibernated(self, sandbox_id: str) -> None:
        """Lay out a sandbox hibernated on another host (SandboxNotFound without a store)."""
        await self.runtime.fetch_hibernated(sandbox_id)

    async def update_network(self, sandbox_id: str, network: NetworkPolicy) -> NetworkPolicy:
        return await self.runtime.update_network(sandbox_id, network)

    async def offer_migration(self, sandbox_id: str) -> MigrationDocument:
        return await self.runtime.migrations.offer(sandbox_id)

    async def accept_migration(self, sandbox_id: str,
                               offer: MigrationDocument) -> MigrationDocument:
        return await self.runtime.migrations.accept(sandbox_id, offer, self.migration_host)

    async def migrate(self, sandbox_id: str, ticket: MigrationDocument) -> MigrationDocument:
        return await self.runtime.migrations.send(sandbox_id, ticket)

    async def complete_migration(self, sandbox_id: str, handoff: MigrationDocument) -> None:
        await self.runtime.migrations.complete(sandbox_id, handoff)

    async def release_migrated(self, sandbox_id: str) -> None:
        await self.runtime.migrations.release(sandbox_id)

    async def abort_migration(self, sandbox_id: str) -> None:
        await self.runtime.migrations.abort(sandbox_id)

    async def offer_snapshot(self, sandbox_id: str) -> TransferDocument:
        return await self.runtime.transfers.offer(sandbox_id)

    async def accept_snapshot(self, offer: TransferDocument) -> TransferDocument:
        # The files arrive where a migration's memory does: this host's own address.
        return await self.runtime.transfers.accept(offer, self.migration_host)

    async def send_snapshot(self, snapshot_id: str, ticket: TransferDocument) -> None:
        await self.runtime.transfers.send(snapshot_id, ticket)

    async def placement(self, sandbox_id: str) -> SandboxPlacement:
        described = self.runtime.describe(sandbox_id)
        network = described.get("network")
        slot = described.get("slot")
        return SandboxPlacement(
            network=NetworkPolicy.from_dict(network) if isinstance(network, dict) else None,
            ns_ip=getattr(slot, "ns_ip", None))

    async def console_log(self, sandbox_id: str, max_bytes: int) -> bytes:
        workdir = self.runtime.get(sandbox_id).workdir
        return await asyncio.to_thread(_tail, workdir / "console.log", max_bytes)

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return await self.runtime.snapshot_info(snapshot_id)

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        return await asyncio.to_thread(self.runtime.snapshots.all,
                                       include_internal=include_internal)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        rt = self.runtime
        if rt.fork_buffer.holds(rt.snapshots.stream(snapshot_id)):
            # A fork's (transfer.py): its stream is a link into the fork buffer, given back
            # on the event loop (it schedules the buffer's expiry); the rest is links.
            rt.delete_snapshot(snapshot_id)
            return
        await asyncio.to_thread(rt.delete_snapshot, snapshot_id)

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None,
                             vcpus: int = DEFAULT_VCPUS, memory_mb: int = DEFAULT_MEMORY_MB,
                             cache_scope: str = "",
                             registry_logins: RegistryLogins | None = None) -> BuildResult:
        return await self.builds.build(spec, log=log, network=network, vcpus=vcpus,
                                       memory_mb=memory_mb, cache_scope=cache_scope,
                                       registry_logins=registry_logins)

    async def inspect_image(self, reference: str, *,
                            registry_logins: RegistryLogins | None = None) -> ImageInfo:
        return await asyncio.to_thread(inspect_image, reference, logins=registry_logins,
                                       home=self.runtime.config.home)

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        def prune() -> list[str]:
            entries = sorted(self.builds.cache_entries(),
                             key=lambda e: max(e.last_used_at, e.created_at), reverse=True)
            kept = {e.key for e in entries[:max(0, keep_newest)]}
            return self.builds.prune_cache(lambda entry: entry.key in kept)
        return await asyncio.to_thread(prune)


def _tail(path: Path, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            return f.read(max_bytes)
    except FileNotFoundError:
        return b""
