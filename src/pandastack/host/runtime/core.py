"""The in-process host runtime: create sandboxes by restoring templates or snapshots, pause,
snapshot, fork, hibernate and wake them, find them, kill them.

Every sandbox owns exactly one directory under the state dir (its disk layers, sockets, logs
and `sandbox.json`) and at most one VMM process, started in its own session so that it
outlives this process. Kill removes both. `start()` re-adopts the VMs that are still running,
hibernated sandboxes, and sandboxes whose VM died as `stopped` (their disks kept until the
control plane wakes or kills them: ADR 0037), and removes what is no sandbox's, so a crash or
restart of the host process loses nothing and leaks nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pandastack.host.config import HostConfig
from pandastack.host.gc import hold_version, kill_orphan_vmms
from pandastack.host.images.build import GuestImage
from pandastack.host.memory.admission import MemoryAdmission, file_bytes
from pandastack.host.memory.fork_buffer import ForkBuffer
from pandastack.host.memory.huge_pool import HugePagePool
from pandastack.host.network.egress_proxy import EgressProxy, Resolver
from pandastack.host.network.manager import NetworkManager, ProxyPorts, Slot
from pandastack.host.runtime.console import watch_consoles
from pandastack.host.runtime.disk_layers import LayerMerges
from pandastack.host.runtime.hibernation import Hibernation
from pandastack.host.runtime.machinery import ImageSource, Machinery
from pandastack.host.runtime.migration import Migrations
from pandastack.host.runtime.records import (
    SANDBOX_ID_RE,
    STOPPED,
    AdoptReport,
    SandboxRecord,
    scan_vmm_processes,
    sort_state_dir,
)
from pandastack.host.runtime.recovery import finish_wake, settle_adopted
from pandastack.host.runtime.remote import (
    RemoteState,
    open_remote,
    sandbox_manifest,
    snapshot_manifest,
)
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.runtime.saving import Saves
from pandastack.host.runtime.slots import SandboxSlots
from pandastack.host.runtime.snapshots import (
    SnapshotStore,
    link_layers,
    new_layer_name,
)
from pandastack.host.runtime.table import SandboxTable
from pandastack.host.runtime.transfer import Transfers
from pandastack.host.templates.builtin import Template, TemplateStore
from pandastack.host.vmm.driver import (
    Capability,
    MachineShape,
    SnapshotFiles,
    VMMDriver,
    VMPaths,
    VMProcess,
    VolumeDrive,
    iter_cmdlines,
    require,
)
from pandastack.host.volumes.attach import HostVolumes, Mounted, mounts_of
from pandastack.host.volumes.store import VolumeStore
from pandastack.hostport.errors import (
    HostError,
    HugePagesUnavailable,
    SandboxNotFound,
    SandboxStateError,
    SetupError,
    SnapshotNotFound,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.results import ForkChildren, SnapshotInfo, SnapshotResult
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS
from pandastack.tracing import span, traced

MAX_VCPUS = 8
MAX_MEMORY_MB = 16384
MIN_MEMORY_MB = 128
MAX_DISK_MB = 1 << 20
MIB = 1 << 20

Progress = Callable[[str], None]


class HostRuntime:
    """Single-machine runtime. Use `async with HostRuntime(...) as rt:` or start()/close()."""

    def __init__(self, config: HostConfig | None = None, *, progress: Progress = print,
                 resolver: Resolver | None = None, images: ImageSource | None = None):
        """`resolver`: how the egress proxy resolves the names of domain rules (the host's
        resolver by default). `images`: where guest images come from (found in, or built
        into, the cache under `config.home` by default)."""
        self.config = config or HostConfig.from_env()
        self.progress = progress
        self.snapshots = SnapshotStore(self.config.snapshots_dir)
        ports = ProxyPorts(self.config.egress_http_port, self.config.egress_tls_port)
        self.network = NetworkManager(self.config.network_claims_dir, self.config.network_pool,
                                      dns_upstream=self.config.dns_upstream, proxy_ports=ports,
                                      operator_allow=self.config.network_operator_allow)
        self.egress = EgressProxy(ports, self.config.network_pool, resolver=resolver,
                                  operator_allow=self.config.network_operator_allow)
        self.fork_buffer = ForkBuffer(self.config.fork_buffer_dir, self.config.fork_buffer_s,
                                      progress)
        self.huge_pool = HugePagePool(self.config.hugetlb_claim, progress=progress)
        self.admission = MemoryAdmission.for_host(self.config)
        self.slots = SandboxSlots(self.network, self.egress,
                                  self.config.sandboxes_dir / ".spare-slots", progress,
                                  enabled=self.config.networking)
        self.merges = LayerMerges(lambda: self.driver, progress)
        self._console_watch: asyncio.Task[None] | None = None
        self.table = SandboxTable(self.config.sandboxes_dir)  # every sandbox's handle and record
        self.machinery = Machinery(self.config, self.network, self.huge_pool,
                                   self._pinned_templates, progress, images)
        # Snapshots and hibernations shared with other hosts (ADR 0020); opened by start().
        self.remote: RemoteState | None = None
        self.migrations = Migrations(self)  # live migration in and out (ADR 0023)
        self.transfers = Transfers(self)  # fork snapshots streamed host to host (ADR 0024)
        self.saves = Saves(self)  # snapshots and forks
        self.hibernation = Hibernation(self)
        self.volumes = HostVolumes(VolumeStore(self.config.volumes_dir), lambda: (
            (r.id, mounts_of(r.volumes)) for r in self.table.records()), progress)

    async def __aenter__(self) -> HostRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def sandboxes_dir(self) -> Path:
        return self.config.sandboxes_dir

    # -- preparation ----------------------------------------------------------------------

    async def prepare(self) -> TemplateStore:
        """Make sure the base guest image exists and pick the accelerator (cached after first
        run). Other image variants are built when a template first needs them. First, the
        runtime's directories are made private and the process umask 0077 (file_modes.py)."""
        return await self.machinery.prepare()

    async def image(self, variant: str, progress: Progress | None = None) -> GuestImage:
        """The guest image of a variant, built (or found in the cache) once per process."""
        return await self.machinery.image(variant, progress)

    def _pinned_templates(self) -> list[Path]:
        """Templates that must survive garbage collection although no VM runs from them."""
        pinned = self.snapshots.template_paths()
        pinned += [Path(r.template_path) for r in self.table.records()]
        return pinned

    @property
    def driver(self) -> VMMDriver:
        return self.machinery.driver

    async def ensure_template(self, name: str = DEFAULT_TEMPLATE,
                              shape: MachineShape | None = None) -> Template:
        store = await self.prepare()
        return await store.ensure(name, shape, progress=self.progress)

    async def prepare_template(self, name: str, *, vcpus: int = DEFAULT_VCPUS,
                               memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        """Build (or find) built-in template `name` for that shape; creates then restore at
        once. Unknown names raise TemplateNotFound."""
        await self.ensure_template(name, MachineShape(vcpus, memory_mb))

    # -- adoption -------------------------------------------------------------------------

    async def start(self) -> AdoptReport:
        """Re-adopt running and hibernated sandboxes from the state dir, and those whose VM
        died as `stopped` (their disks kept: `records.sort_state_dir`); clean up the rest."""
        self.sandboxes_dir.mkdir(parents=True, exist_ok=True)
        await self.prepare()
        if self.config.object_store is not None and self.remote is None:
            self.remote = open_remote(self.config, lambda: self.driver, self.progress)
        self.snapshots.sweep()
        await asyncio.to_thread(self.volumes.store.sweep)
        await asyncio.to_thread(self.fork_buffer.sweep)
        await asyncio.to_thread(self.huge_pool.sweep)
        cmdlines = await asyncio.to_thread(lambda: list(iter_cmdlines()))  # one /proc walk
        # Host-wide: VMMs whose directory is gone belong to no runtime, this one included.
        orphans = await asyncio.to_thread(kill_orphan_vmms, self.progress, cmdlines)
        adopted: list[str] = []
        stopped: list[str] = []
        cleaned = [workdir.name for _, workdir in orphans if workdir.parent == self.sandboxes_dir]
        running = scan_vmm_processes(self.sandboxes_dir, cmdlines,
                                     self.driver.processes.vm_workdir)
        adopt, dead = sort_state_dir(self.sandboxes_dir, running, self.table,
                                     self.driver.owns)
        for record, vm in adopt:
            if vm is not None:  # its driver may have died half way through something
                record, vm = await settle_adopted(self, record, vm)
            if vm is None:  # its state may have changed (records.without_vm)
                record = self.table.save(record)
                if record.state == STOPPED:
                    stopped.append(record.id)
            handle = self.adopt(record, vm)
            if vm is not None and record.state == "hibernated":  # a wake cut short
                await finish_wake(self, handle, record)
                if handle.state == STOPPED:
                    stopped.append(record.id)
            adopted.append(record.id)
        for entry in dead:
            await asyncio.to_thread(shutil.rmtree, entry, True)
            cleaned.append(entry.name)
        # The template versions its sandboxes and snapshots need are this process's too:
        # another runtime's template GC on this host must leave them (host/gc.py).
        for version in self._pinned_templates():
            await asyncio.to_thread(hold_version, version)
        # Network slots of sandboxes (of any runtime on this host) whose directory is gone,
        # and spare slots a crashed predecessor left.
        await self.slots.sweep()
        self.slots.refill_spares()
        if self._console_watch is None:
            self._console_watch = asyncio.get_running_loop().create_task(
                watch_consoles(self.sandboxes_dir, self.progress), name="console-cap")
        await self.slots.reattach(list(self.table.records()))
        return AdoptReport(adopted, cleaned, stopped)

    def adopt(self, record: SandboxRecord, vm: VMProcess | None) -> SandboxHandle:
        """A handle for the sandbox of `record` (written already), in the table."""
        handle = SandboxHandle(  # type: ignore[abstract]  # its listings: see sandbox.py
            record.id, vm, self.sandboxes_dir / record.id, record.hostname, record.created_at,
            self.config.agent_timeout_s, template=record.template, state=record.state,
            waker=self.wake, forked_from=record.forked_from)
        self.table.add(handle, record)
        return handle

    # -- create ---------------------------------------------------------------------------

    @traced("runtime.create")
    async def create(self, template: str = DEFAULT_TEMPLATE, *, vcpus: int = DEFAULT_VCPUS,
                     memory_mb: int = DEFAULT_MEMORY_MB,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | dict[str, Any] | None = None,
                     volumes: Sequence[VolumeMountRequest] = (),
                     forked_from: str | None = None) -> SandboxHandle:
        """Restore a new sandbox and return once its agent is ready.

        From `template` (a fresh machine) or from `snapshot` (the snapshotted machine's memory,
        processes and files; its shape and template come with it). `disk_mb` grows the root
        filesystem (online, after the restore, so only creates that ask pay for it).
        `volumes` are mounted before it returns; a snapshot brings its own (read-write ones
        as new copies: host/volumes/attach.py).
        """
        if disk_mb is not None and not 0 < disk_mb <= MAX_DISK_MB:
            raise ValueError(f"disk_mb must be between 1 and {MAX_DISK_MB}")
        if snapshot is not None and volumes:
            raise ValueError("a sandbox made from a snapshot has the snapshot's volumes")
        # Domain names in a policy are resolved here: off the event loop.
        policy = network if isinstance(network, NetworkPolicy) else \
            await asyncio.to_thread(NetworkPolicy.from_dict, network)
        base_dir: Path | None = None
        base_layers: tuple[str, ...] = ()
        if snapshot is not None:
            snap = await self.snapshot_info(snapshot)
            store = await self.prepare()
            tmpl = store.load_dir(snap.template, Path(snap.template_path))
            state_file = self.snapshots.stream(snapshot)
            base_dir, base_layers = self.snapshots.path(snapshot), snap.layers
            base_bytes, template = snap.disk_bytes, snap.template
        else:
            if not 1 <= vcpus <= MAX_VCPUS:
                raise ValueError(f"vcpus must be between 1 and {MAX_VCPUS}")
            if not MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB:
                raise ValueError(
                    f"memory_mb must be between {MIN_MEMORY_MB} and {MAX_MEMORY_MB}")
            tmpl = await self.ensure_template(template, MachineShape(vcpus, memory_mb))
            state_file, base_bytes = tmpl.snapshot.device_state, tmpl.disk_bytes
        disk_bytes = base_bytes if disk_mb is None else disk_mb * MIB
        if disk_bytes < base_bytes:
            raise ValueError(f"disk_mb must be at least {base_bytes // MIB}")
        if disk_bytes > base_bytes:
            require(self.driver, Capability.DISK_RESIZE, "a root disk larger than the template's")
        sid = sandbox_id or f"sbx-{secrets.token_hex(6)}"
        if not SANDBOX_ID_RE.match(sid):
            raise ValueError(f"invalid sandbox id {sid!r}")
        # Before anything is laid out; a snapshot's stream is loaded, a template's mapped.
        reservation = self.admission.vm_start(f"create {sid}", self.driver.accel,
                                              0 if snapshot is None else file_bytes(state_file))
        workdir = self.sandboxes_dir / sid
        try:
            mounts: tuple[Mounted, ...] = () if snapshot is not None else \
                self.volumes.plan(sid, volumes, self.driver.volume_slots)
            workdir.mkdir(mode=0o700, parents=True, exist_ok=False)
        except BaseException:
            reservation.release()
            self.volumes.settle(sid)
            raise
        disks = self.driver.disks
        top = new_layer_name(disks.suffix)
        record = SandboxRecord(
            id=sid, template=template, template_key=tmpl.key, template_path=str(tmpl.path),
            vcpus=tmpl.snapshot.shape.vcpus, memory_mb=tmpl.snapshot.shape.memory_mb,
            disk_bytes=disk_bytes, hostname=sid, machine_id=uuid.uuid4().hex,
            created_at=time.time(), layers=(*base_layers, top), snapshot=snapshot,
            network=policy.to_dict(), forked_from=forked_from,
        )
        vm: VMProcess | None = None
        slot: Slot | None = None
        try:
            if base_dir is not None and snap.volumes:
                mounts = await asyncio.to_thread(
                    self.volumes.from_snapshot, base_dir, snap.volumes, sid,
                    take=snapshot in self.volumes.handed_over)
            record = replace(record, volumes=tuple(m.record() for m in mounts))
            slot = await self.slots.acquire(workdir, policy)
            record = replace(record, slot=slot.index if slot is not None else None)
            with span("runtime.overlay"):
                if base_dir is not None:
                    link_layers(base_dir, workdir, base_layers)
                    disks.create_layer(workdir / top, workdir / base_layers[-1], base_bytes)
                else:
                    disks.create_layer(workdir / top, tmpl.disk, base_bytes)
            # A snapshot's stream carries all of its memory; a template's memory is its file.
            memory = None if snapshot is not None else await asyncio.to_thread(
                (await self.prepare()).memory_to_restore, tmpl)
            files = replace(tmpl.snapshot, device_state=state_file, memory=memory)
            vm = await self.restore_vm(VMPaths(workdir), files, workdir / top,
                                     slot.netns if slot is not None else None,
                                     self.volumes.drives(self.driver, workdir, mounts))
            record = self.table.save(replace(record, pid=vm.pid))
            self.volumes.settle(sid)
            handle = SandboxHandle(  # type: ignore[abstract]  # its listings: see sandbox.py
                sid, vm, workdir, record.hostname, record.created_at,
                self.config.agent_timeout_s, template=template, waker=self.wake,
                forked_from=forked_from)
            await handle.initialize(record.machine_id)
            handle.on_first_command = reservation.up(str(workdir))  # in MemAvailable now
            if snapshot is None and mounts:
                # After the agent answered: the guest runs, so the stream is loaded.
                await self.volumes.announce(self.driver, vm, mounts)
                await self.volumes.mount(await handle.agent(), mounts)
            if disk_bytes > base_bytes:
                await self.driver.resize_disk(vm, disk_bytes)
                grown = await handle.exec(["resize2fs", "/dev/vda"], timeout=120)
                if grown.exit_code != 0:
                    raise SetupError(f"growing the root filesystem failed: {grown.stderr!r}")
        except BaseException as exc:
            reservation.release()
            if vm is not None:
                vm.kill()
            self.vm_ended(workdir)
            if slot is not None:
                await self.slots.release(slot)
                self.slots.refill_spares()
            self.table.forget(sid)
            self.volumes.settle(sid)
            if snapshot is not None:  # the copies made for it
                self.volumes.drop(m.volume_id for m in mounts if not m.read_only)
            await asyncio.to_thread(shutil.rmtree, workdir, True)
            if isinstance(exc, HostError | ValueError):
                raise
            if isinstance(exc, Exception):
                raise SetupError(f"create from {snapshot or template!r} failed: {exc}") from exc
            raise
        self.table.add(handle)
        # Replace the spare network slot only now: its `ip` and `nft` runs (~20 ms of CPU and
        # the kernel's rtnl lock) competed with this sandbox's own restore, which made
        # create + first exec ~5 ms slower at p50 and up to ~60 ms slower at p99.
        self.slots.refill_spares()
        return handle

    @traced("vmm.restore")
    async def restore_vm(self, paths: VMPaths, files: SnapshotFiles, disk: Path,
                       netns: str | None, volumes: dict[int, VolumeDrive]) -> VMProcess:
        """Restore a VM; one whose memory is all in its stream gets RAM from the hugetlb pool
        when this runtime's share has room (released when the VM ends: `vm_ended`)."""
        owner = str(paths.workdir)
        if (files.memory is None and Capability.HUGETLB_RAM in self.driver.capabilities
                and self.huge_pool.lease(owner, files.shape.memory_mb)):
            try:
                vm = await self.driver.restore(paths, files, disk, netns=netns, hugetlb=True,
                                               volumes=volumes)
                self.huge_pool.served += 1
                return vm
            except HugePagesUnavailable:  # another process took them since the lease
                self.huge_pool.release(owner)
            except BaseException:
                self.huge_pool.release(owner)
                raise
        return await self.driver.restore(paths, files, disk, netns=netns, volumes=volumes)

    def vm_ended(self, workdir: Path) -> None:
        """A sandbox's VMM process is gone: what it held on the host for its life is free."""
        self.huge_pool.release(str(workdir))
        self.admission.ended(str(workdir))

    # -- lookup and kill ------------------------------------------------------------------

    def get(self, sandbox_id: str) -> SandboxHandle:
        return self.table.get(sandbox_id)

    def list(self) -> list[SandboxHandle]:
        return self.table.handles()

    async def kill(self, sandbox_id: str) -> None:
        """Kill the sandbox; with an object store, also its hibernation there (of a sandbox
        this host hibernated, or one whose host is gone)."""
        handle = self.table.take(sandbox_id)
        if handle is None:
            if (self.remote is not None and SANDBOX_ID_RE.match(sandbox_id) and
                    await self.remote.sandbox_document(sandbox_id) is not None):
                await self.remote.delete_manifest(sandbox_manifest(sandbox_id))
                return
            raise SandboxNotFound(sandbox_id)
        record = self.table.find_record(sandbox_id)
        if self.remote is not None and record is not None and record.in_store:
            # First: a kill that fails half-way must not leave a state to wake elsewhere.
            try:
                await self.remote.delete_sandbox_manifest(sandbox_id, record.store_writer)
            except BaseException:
                self.table.add(handle)
                raise
        if record is not None and record.volumes:
            await self.volumes.flush(self.driver, handle, mounts_of(record.volumes),
                                     ending=True)
        self.merges.forget(sandbox_id)
        record = self.table.forget(sandbox_id)
        try:
            await handle.destroy()
        finally:
            self.vm_ended(handle.workdir)
        if record is not None and record.slot is not None:
            await self.slots.release(self.slots.slot(record.slot))

    async def update_network(self, sandbox_id: str,
                             network: NetworkPolicy | dict[str, Any]) -> NetworkPolicy:
        """Replace the sandbox's egress policy; takes effect for new connections at once."""
        self.get(sandbox_id)
        policy = network if isinstance(network, NetworkPolicy) else \
            await asyncio.to_thread(NetworkPolicy.from_dict, network)
        record = self.table.record(sandbox_id)
        if record.slot is None:
            raise SandboxStateError(f"sandbox {sandbox_id} has no network")
        await self.slots.change(self.slots.slot(record.slot), policy,
                                NetworkPolicy.from_dict(record.network))
        self.table.save(replace(record, network=policy.to_dict()))
        return policy

    async def kill_all(self) -> None:
        """Kill every sandbox and release the prepared network slots (a later create makes
        new ones): after this, the runtime holds nothing on the host."""
        await self.migrations.close()
        for sid in self.table.ids():
            await self.kill(sid)
        await self.slots.drop_spares()
        await self.fork_buffer.close()
        await self.huge_pool.close()

    async def close(self) -> None:
        """Drop agent connections; the VMs keep running and a later start() re-adopts them.
        The egress proxy's listeners close (proxied connections end with them)."""
        if self._console_watch is not None:
            self._console_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._console_watch
            self._console_watch = None
        await self.migrations.close()
        await self.transfers.close()
        await self.egress.close()
        await self.slots.drop_spares()
        await self.fork_buffer.close()
        await self.huge_pool.close()
        if self.remote is not None:
            await self.remote.close()
            self.remote = None
        for handle in self.table.handles():
            await handle.disconnect()
        self.table.clear()
        self.merges.clear()
        # What this runtime still held (an incoming snapshot no one took) is a crash's
        # leftover now, for the next start to sweep (a new runtime in this process too).
        self.snapshots.release_all()

    # -- pause, snapshot, fork ------------------------------------------------------------

    async def pause(self, sandbox_id: str) -> None:
        handle, vm = self.table.running(sandbox_id, "running", "paused")
        async with handle.lifecycle_lock:
            if handle.state == "running":
                await self.driver.pause(vm)
                handle.state = "paused"
                self.table.save(replace(self.table.record(sandbox_id), state="paused"))

    async def resume(self, sandbox_id: str) -> None:
        handle, vm = self.table.running(sandbox_id, "running", "paused")
        async with handle.lifecycle_lock:
            if handle.state == "paused":
                await self.driver.resume(vm)
                handle.state = "running"
                self.table.save(replace(self.table.record(sandbox_id), state="running"))
                await handle.resync_clock(self.table.record(sandbox_id).machine_id)

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False, short_pause: bool | None = None,
                       transient: bool = False) -> SnapshotResult:
        """Capture memory, device state and disk; the sandbox keeps running (or paused).
        See `saving.Saves.snapshot`."""
        return await self.saves.snapshot(sandbox_id, name, internal=internal,
                                         short_pause=short_pause, transient=transient)

    async def fork(self, sandbox_id: str, count: int = 1) -> ForkChildren[SandboxHandle]:
        """`count` live copies of a running sandbox, with the parent's pause
        (`saving.Saves.fork`)."""
        return await self.saves.fork(sandbox_id, count)

    # -- disk layers ----------------------------------------------------------------------

    async def start_flatten(self, sandbox_id: str, vm: VMProcess) -> None:
        """(Under the lifecycle lock.) Start merging the sandbox's layers into its top."""
        record = self.table.record(sandbox_id)

        async def template_disk() -> Path:
            store = await self.prepare()
            return store.load_dir(record.template, Path(record.template_path)).disk

        await self.merges.start(sandbox_id, vm, record.layers, template_disk)

    async def settle_flatten(self, sandbox_id: str, vm: VMProcess) -> None:
        """(Under the lifecycle lock, before the disk changes.) End a merge under way; once
        it is done the sandbox's own layers are its top alone, and the others' links go
        (snapshots and children hold their own)."""
        if not self.merges.under_way(sandbox_id):
            return
        record = self.table.record(sandbox_id)
        layers = await self.merges.settle(sandbox_id, vm)
        if layers is not None and record.layers == layers:
            self.table.save(replace(record, layers=(record.top,)))
            workdir = self.sandboxes_dir / sandbox_id
            for name in layers[:-1]:
                (workdir / name).unlink(missing_ok=True)

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        """The snapshot, fetched from the object store first where this host does not hold
        it (SnapshotNotFound where neither does)."""
        try:
            return await asyncio.to_thread(self.snapshots.get, snapshot_id)
        except SnapshotNotFound:
            if self.remote is None:
                raise
        self.snapshots.path(snapshot_id)  # SnapshotNotFound for what is no snapshot id
        if not await self.remote.fetch_snapshot(snapshot_id, self.snapshots):
            raise SnapshotNotFound(snapshot_id)
        return await asyncio.to_thread(self.snapshots.get, snapshot_id)

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete the snapshot here and, with an object store, its manifest there (blocking
        then: callers run this in a thread). The objects stay: others may share them."""
        path = self.snapshots.path(snapshot_id)
        if self.remote is not None and not (path.exists() and
                                            self.snapshots.get(snapshot_id).transient):
            in_store = self.remote.delete_manifest_blocking(snapshot_manifest(snapshot_id))
            if not path.exists():
                if not in_store:
                    raise SnapshotNotFound(snapshot_id)
                return
        in_buffer = self.fork_buffer.holds(self.snapshots.stream(snapshot_id))
        self.snapshots.delete(snapshot_id)
        if in_buffer:
            self.fork_buffer.give_back()

    # -- hibernation ----------------------------------------------------------------------

    async def hibernate(self, sandbox_id: str) -> None:
        """Write the sandbox's whole state to disk and end its VM (`hibernation.py`)."""
        await self.hibernation.hibernate(sandbox_id)

    async def wake(self, sandbox_id: str) -> None:
        """Restore a hibernated sandbox; a no-op for one that is awake (`hibernation.py`)."""
        await self.hibernation.wake(sandbox_id)

    async def fetch_hibernated(self, sandbox_id: str) -> None:
        """A sandbox another host hibernated into the object store, laid out here hibernated
        (`hibernation.py`)."""
        await self.hibernation.fetch_hibernated(sandbox_id)

    def describe(self, sandbox_id: str) -> dict[str, object]:
        handle = self.get(sandbox_id)
        record = self.table.find_record(sandbox_id)
        return {"id": sandbox_id, "state": handle.state, "pid": handle.pid,
                "layers": [*record.layers] if record else [],
                "snapshot": record.snapshot if record else None,
                "network": record.network if record else None,
                "slot": (self.slots.slot(record.slot) if record and record.slot is not None
                         else None)}

