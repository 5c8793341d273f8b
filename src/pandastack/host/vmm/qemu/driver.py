"""QEMU `-M microvm` driver.

Templates are booted with RAM in a `memory-backend-file` mapped `share=on`, so that once the VM
is stopped the file *is* its memory. Saving writes only device state, with the migration
capability `x-ignore-shared` (QEMU skips shared RAM blocks). A clone maps the same file with
`share=off`: private copy-on-write pages, so any number of clones share one page cache and the
file never changes. The clone loads device state from an inherited fd (`-incoming fd:N`) and,
started without `-S`, runs as soon as the load completes: no QMP round trip on the create path.

VMs are started in their own session and survive a restart of the host process. Their disks
are qcow2 chains (disk.py); QMP is spoken in qmp.py, the command line is built from
command.py's parts, saves are in save.py and live migration in migrate.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from qemu.qmp import QMPClient

from pandastack.host.file_modes import PRIVATE_FILE, SERVICE_UMASK
from pandastack.host.network.manager import GUEST_MAC, TAP
from pandastack.host.vmm.driver import (
    AGENT_PORT_NAME,
    VOLUME_SLOTS,
    Capability,
    KernelSpec,
    MachineShape,
    MigrationStats,
    SnapshotFiles,
    SnapshotPause,
    VMPaths,
    VMProcess,
    VolumeDrive,
    connect_unix,
    log_tail,
    read_cmdline,
)
from pandastack.host.vmm.qemu import jail
from pandastack.host.vmm.qemu import migrate as qemu_migrate
from pandastack.host.vmm.qemu import save as qemu_save
from pandastack.host.vmm.qemu.command import (
    MACHINE,
    MACHINE_BEFORE_IDENTITY,
    NO_HUGE_PAGES,
    TCG_PRECOPY_FIXED,
    VM_NAME_PREFIX,
    DiskLimits,
    QemuProcesses,
    huge_pages_inherited,
    parse_release,
    qemu_version,
    volume_drive,
    volume_slot_args,
)
from pandastack.host.vmm.qemu.disk import ROOT_DRIVE, Qcow2Layers, switch_top
from pandastack.host.vmm.qemu.jail import JailSettings
from pandastack.host.vmm.qemu.qmp import (
    connect_qmp,
    qmp_pipeline,
    qmp_socket,
    wait_migration,
)
from pandastack.hostport.errors import HugePagesUnavailable, SnapshotFailed, VMMError
from pandastack.tracing import span

# Where running guests eat the host's memory reserve after their admission (ADR 0050), the
# kernel's OOM killer should end a VM, not the API server or the agent: VMMs would otherwise
# inherit the agent's score (OOMScoreAdjust=-500 in its unit) and be picked last of all.
VMM_OOM_SCORE_ADJ = 500


class QemuDriver:
    name = "qemu"
    # Everything the runtime may ask; where this QEMU cannot keep a save's pause short
    # (TCG before 9.0 and RAM userfaultfd cannot protect) it stops the guest instead.
    capabilities = frozenset(Capability)
    disks = Qcow2Layers()
    processes = QemuProcesses()

    def __init__(self, accel: str, *, binary: str = "qemu-system-x86_64", tb_size_mb: int = 64,
                 tcg_cpu: str = "max", precopy: bool | None = None,
                 stream_huge_pages: bool = True, volume_slots: int = VOLUME_SLOTS,
                 jail: JailSettings | None = None, disk_limits: DiskLimits | None = None,
                 legacy_pit: bool | None = None):
        """`precopy`: whether snapshots copy memory while the guest runs; None decides by
        accelerator and QEMU version (see `live_precopy`). `stream_huge_pages`: whether a VM
        restored from a stream (a snapshot, fork or wake) gets transparent huge pages for its
        anonymous RAM (see `vmm.host_memory.reports_free_pages`). `jail`: run each VMM as its own
        uid, chrooted, seccomp-filtered, in its own cgroup (jail.py); None runs it as root.
        `legacy_pit`: whether the machine has the i8254 timer; None: not under TCG. Nothing in
        the guest uses it (the kernel's clock events are the local APIC's), but the firmware
        leaves it counting in mode 3, and QEMU's main loop woke for each of its edges, 36 times
        a second in every idle VM: 0.64 against 0.39 % of a core per idle VM (ADR 0040)."""
        if accel not in ("kvm", "tcg"):
            raise ValueError(f"accel must be kvm or tcg, not {accel!r}")
        self.accel = accel
        self.stream_huge_pages = stream_huge_pages
        self.volume_slots = volume_slots
        self.binary = binary
        self.tb_size_mb = tb_size_mb
        self.cpu = "host" if accel == "kvm" else tcg_cpu
        self._precopy = precopy
        self.jail = jail
        self.disk_limits = disk_limits or DiskLimits(0, 0)
        self.legacy_pit = accel == "kvm" if legacy_pit is None else legacy_pit

    def live_precopy(self) -> bool:
        """Whether a snapshot may copy memory while the guest runs. Not under TCG before
        QEMU 9.0 (TCG_PRECOPY_FIXED): there the guest is stopped for the whole save."""
        if self._precopy is None:
            self._precopy = (self.accel == "kvm"
                             or parse_release(qemu_version(self.binary)) >= TCG_PRECOPY_FIXED)
        return self._precopy

    def identity(self) -> str:
        return (f"{qemu_version(self.binary)}|{self.accel}|{self.cpu}|{self.machine()}"
                f"|volume-slots-{self.volume_slots}")

    def machine(self) -> str:
        """The `-M` value: part of the templates' key, since a restore needs the same devices."""
        return MACHINE + ("" if self.legacy_pit else ",pit=off")

    def machine_for(self, saved_by: str) -> str:
        """The machine to restore into what the driver `saved_by` (`SnapshotFiles.saved_by`)
        saved: the one its template was baked on. A stream with a device the machine lacks
        does not load (sandboxes, snapshots and hibernations made before ADR 0040 have the
        PIT's state); the reverse loads."""
        for part in saved_by.split("|"):
            if part == MACHINE_BEFORE_IDENTITY:
                return MACHINE
            if part.startswith("microvm,"):
                return part
        return self.machine()

    # -- command line ---------------------------------------------------------------------

    def _argv(self, paths: VMPaths, kernel: KernelSpec, shape: MachineShape,
              memory_file: Path | None, *, share: bool, disk: Path,
              netns: str | None = None, hugetlb: bool = False,
              volumes: Mapping[int, VolumeDrive] | None = None,
              machine: str | None = None) -> list[str]:
        if self.accel == "kvm":
            accel, cpu = "kvm", self.cpu
        else:
            accel, cpu = f"tcg,tb-size={self.tb_size_mb}", self.cpu
        mem = f"{shape.memory_mb}M"
        if memory_file is None and hugetlb:
            # Private, so the RAM is still sent whole by a later snapshot (x-ignore-shared
            # leaves out shared RAM only): streams stay the same whatever backs the RAM.
            backend = (f"memory-backend-memfd,id=ram,size={mem},hugetlb=on,hugetlbsize=2M,"
                       "share=off")
        elif memory_file is None:
            # Everything comes from the stream: anonymous memory (with transparent huge
            # pages) loads it several times faster than private copies of a file's pages.
            backend = f"memory-backend-ram,id=ram,size={mem}"
        else:
            backend = (f"memory-backend-file,id=ram,size={mem},mem-path={memory_file},"
                       f"share={'on' if share else 'off'}")
        # The device order defines the virtio-mmio slots: it must be identical for boot and
        # restore, so both paths share this one function.
        # The VM runs inside its sandbox's network namespace, where its tap device lives.
        prefix = ["nsenter", f"--net=/run/netns/{netns}", "--"] if netns else []
        # A drive QEMU may write is opened read-write at once: with auto-read-only, an
        # incoming VM (inactive disks: no writer yet) opens it read-only and reopens it by
        # name when its disks activate, which a jailed QEMU cannot (jail.py).
        rw = ",file.auto-read-only=off" if self.jail is not None else ""
        # After a snapshot QEMU reopens the old top read-only, by name: jailed, that fails
        # (QEMU carries on), the layer stays open for writing and its image lock would keep
        # every other VM from reading the frozen layer. The runtime, not QEMU's image
        # locks, decides which VM writes which layer.
        root_rw = f"{rw},file.locking=off" if rw else ""
        throttle = self.disk_limits.drive_options(shape.vcpus)
        return [
            *prefix,
            self.binary,
            "-name", f"{VM_NAME_PREFIX}{paths.workdir.name}",
            "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
            "-accel", accel, "-cpu", cpu,
            "-object", backend,
            "-M", machine or self.machine(),
            "-m", mem, "-smp", str(shape.vcpus),
            "-kernel", str(kernel.kernel), "-initrd", str(kernel.initrd),
            "-append", kernel.cmdline,
            # Appended to, so that the runtime can trim it under a writing guest (console.py).
            "-chardev", f"file,id=console,path={paths.console_log},append=on",
            "-serial", "chardev:console",
            "-drive", f"id={ROOT_DRIVE},file={disk},format=qcow2,if=none,discard=unmap"
                      f"{root_rw}{throttle}",
            "-device", f"virtio-blk-device,drive={ROOT_DRIVE}",
            "-device", "virtio-serial-device,max_ports=2",
            "-chardev", f"socket,id=agent,path={paths.agent_socket},server=on,wait=off",
            "-device", f"virtserialport,chardev=agent,name={AGENT_PORT_NAME}",
            "-chardev", f"socket,id=qmp,path={qmp_socket(paths)},server=on,wait=off",
            "-mon", "chardev=qmp,mode=control",
            "-netdev", f"tap,id=net0,ifname={TAP},script=no,downscript=no",
            "-device", f"virtio-net-device,netdev=net0,mac={GUEST_MAC}",
            *volume_slot_args(paths, volumes or {}, self.volume_slots, rw + throttle),
            # Templates are saved stopped; without the run state in the stream, a restored
            # clone is not held "paused" but starts as soon as its state is loaded.
            "-global", "migration.store-global-state=off",
            # After an incoming migration QEMU has the guest announce itself (gratuitous ARP,
            # IPv6 neighbour adverts) five times over ~0.5 s, for switches that must relearn
            # where a migrated VM now lives. A sandbox's tap is new and private, so there is
            # nothing to relearn; every restore paid ~15 ms of guest time and ~1 MiB of
            # translated code for it.
            "-global", "migration.announce-rounds=0",
        ]

    def _spawn(self, argv: list[str], paths: VMPaths, shape: MachineShape, netns: str | None,
               pass_fds: tuple[int, ...] = (), *, huge_pages: bool = True) -> VMProcess:
        paths.workdir.mkdir(parents=True, exist_ok=True)
        with span("vmm.jail"):  # its uid, chroot and cgroup (jail.py)
            cell = (jail.prepare(paths, shape, netns, self.jail) if self.jail is not None
                    else None)
        if cell is not None:
            argv = [*argv, *cell.qemu_args()]
        try:
            with span("vmm.spawn"):
                vm = self._popen(argv, paths, pass_fds, huge_pages=huge_pages)
        except BaseException:
            if cell is not None:
                jail.release(paths.workdir)
            raise
        if cell is not None:
            try:
                jail.enter(cell, vm.pid)
            except BaseException:
                vm.kill()
                raise
        return vm

    def _popen(self, argv: list[str], paths: VMPaths, pass_fds: tuple[int, ...], *,
               huge_pages: bool) -> VMProcess:
        log = os.open(paths.vmm_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                      PRIVATE_FILE)
        with open(log, "ab") as log_file, huge_pages_inherited(huge_pages):
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    pass_fds=pass_fds,
                    start_new_session=True,  # survives the host process, immune to its signals
                    cwd=paths.workdir,
                    # What QEMU creates (console log, sockets) is private whatever this
                    # process's umask is (host/file_modes.py).
                    umask=SERVICE_UMASK,
                )
            except OSError as exc:
                raise VMMError(f"cannot start {argv[0]}: {exc}") from exc
        with contextlib.suppress(OSError):  # raising a score needs no privilege
            Path(f"/proc/{popen.pid}/oom_score_adj").write_text(f"{VMM_OOM_SCORE_ADJ}\n")
        return VMProcess(popen.pid, paths, popen)

    # -- driver interface -----------------------------------------------------------------

    def boot(self, paths: VMPaths, kernel: KernelSpec, disk: Path, memory_file: Path | None,
             shape: MachineShape, *, netns: str | None = None) -> VMProcess:
        for stale in (paths.agent_socket, qmp_socket(paths)):
            stale.unlink(missing_ok=True)
        return self._spawn(self._argv(paths, kernel, shape, memory_file, share=True, disk=disk,
                                      netns=netns), paths, shape, netns)

    async def restore(self, paths: VMPaths, snapshot: SnapshotFiles, disk: Path, *,
                      netns: str | None = None, hugetlb: bool = False,
                      volumes: Mapping[int, VolumeDrive] | None = None) -> VMProcess:
        if hugetlb and snapshot.memory is not None:
            raise ValueError("hugetlb RAM is for restores from a stream only")
        # Sockets an earlier VMM left (before a wake, or a second try) must not be mistaken
        # for the new one's.
        for stale in (paths.agent_socket, qmp_socket(paths)):
            stale.unlink(missing_ok=True)
        fd = os.open(snapshot.device_state, os.O_RDONLY | os.O_CLOEXEC)
        try:
            argv = self._argv(paths, snapshot.kernel, snapshot.shape, snapshot.memory,
                              share=False, disk=disk, netns=netns, hugetlb=hugetlb,
                              volumes=volumes, machine=self.machine_for(snapshot.saved_by))
            argv += ["-incoming", "defer"]
            # QEMU asks for transparent huge pages for its TCG code buffer, so a clone's
            # translated code grows 2 MiB at a time: without them an idle clone of a template
            # costs ~3 MiB less (PSS 46.9 -> 44.0 MiB, no measurable change in speed). A
            # restore from a stream may keep them: its RAM is anonymous and loads faster so,
            # except where fresh memory is slow to touch in 2 MiB pages.
            vm = self._spawn(argv, paths, snapshot.shape, netns, pass_fds=(fd,),
                             huge_pages=snapshot.memory is None and self.stream_huge_pages)
        finally:
            os.close(fd)
        try:
            # Until QEMU has taken the load; the load itself ends inside the handshake.
            with span("vmm.qmp_restore"):
                # Connect to the agent port before the guest runs, so the guest sees the
                # port already open when it resumes instead of an EOF and a back-off.
                vm.agent_connection = await connect_unix(paths.agent_socket,
                                                         alive=vm.is_alive)
                # QEMU 7.2 cannot enable x-ignore-shared from the command line, so the
                # capability and the load go through QMP: three commands pipelined in one
                # write, one round trip. Without -S the guest runs as soon as the load
                # completes.
                await qmp_pipeline(qmp_socket(paths), [
                    ("migrate-set-capabilities", {"capabilities": [
                        {"capability": "x-ignore-shared", "state": True}]}),
                    ("migrate-incoming", {"uri": f"fd:{fd}"}),
                ], alive=vm.is_alive)
        except BaseException as exc:
            vm.kill()
            if vm.agent_connection is not None:
                vm.agent_connection.close()
                vm.agent_connection = None
            # QEMU makes its sockets before it maps RAM: a VMM that could not map it shows as
            # an early exit or as a connection it reset; only its log says why.
            log = log_tail(paths.agent_socket) if hugetlb else ""
            if isinstance(exc, Exception) and NO_HUGE_PAGES in log:
                raise HugePagesUnavailable(f"no free hugetlb pages: {exc}") from exc
            raise
        return vm

    async def save(self, vm: VMProcess, device_state: Path) -> None:
        # A template's RAM is a shared file, which x-ignore-shared leaves out of the stream:
        # the same stopped save as hibernation writes only device state here.
        await self.save_stopped(vm, device_state)

    async def pause(self, vm: VMProcess) -> None:
        await qmp_pipeline(qmp_socket(vm.paths), [("stop", {})], alive=vm.is_alive)

    async def resume(self, vm: VMProcess) -> None:
        await qmp_pipeline(qmp_socket(vm.paths), [("cont", {})], alive=vm.is_alive)

    async def snapshot_live(self, vm: VMProcess, stream: Path, new_top: Path, *,
                            short_pause: bool = False, overwrite: bool = False
                            ) -> SnapshotPause:
        """Save memory and device state while the guest runs; report the guest's pause.

        While the guest is stopped, the disk is switched onto `new_top` (an empty overlay the
        caller made over the current top), so the old top is frozen in exactly the state the
        memory refers to. Three ways, by what this QEMU can do correctly:

        - `live_precopy()` (KVM, or QEMU >= 9.0): pre-copy streams RAM while the guest runs
          and stops it only for the last dirty pages.
        - otherwise (TCG on QEMU < 9.0, whose dirty tracking loses writes), with
          `short_pause`: a background snapshot. The guest is stopped only while its device
          state is captured and its RAM write-protected (userfaultfd); then it runs while each
          page is saved before its first write. Needs RAM that userfaultfd can protect
          (anonymous, or a template file staged on tmpfs); QEMU refuses otherwise, and the
          next way is taken. The save takes several times longer than a stopped one.
        - otherwise: the guest is stopped for the whole save, which is then one instant by
          construction (the pause is about what a hibernation takes).

        With `overwrite` the stream goes straight into `stream` (see the protocol); a
        background snapshot, which reserves its worst case first, never overwrites.
        """
        qmp = await connect_qmp(qmp_socket(vm.paths))
        target = stream if overwrite else stream.with_suffix(".partial")
        switched = was_running = background = False
        stopped_at: float | None = None
        kept: int | None = None
        try:
            status = await qmp.execute("query-status")
            was_running = isinstance(status, dict) and bool(status.get("running"))
            if was_running and not self.live_precopy() and short_pause and not overwrite:
                background = await qemu_save.prepare_save(qmp, background=True)
            if background:
                # QEMU 7.2 leaves the guest hung (vCPUs blocked on write-protected pages) when
                # a background snapshot fails to write: reserve the space while nothing is
                # stopped yet, so running out of it is a clean error.
                bound = qemu_save.stream_bound(await qmp.execute("query-memory-size-summary"))
                kept = await qemu_save.pass_stream_fd(qmp, target, reserve=bound)
            else:
                await qemu_save.prepare_save(qmp)
                kept = await qemu_save.pass_stream_fd(qmp, target, truncate=not overwrite)
            if was_running and not self.live_precopy():
                stopped_at = time.monotonic()
                await qmp.execute("stop")
            if background:
                # QEMU captures the device state in this same stop: switch the disk first.
                await self._switch_disk(qmp, new_top)
                switched = True
                await qemu_save.start_stream(qmp)
                resumed = await qemu_save.wait_running(qmp)  # QEMU resumes the guest by itself
                await wait_migration(qmp, poll_s=0.002)
            else:
                await qemu_save.start_stream(qmp)
                if stopped_at is not None or not was_running:
                    # The guest is stopped already: switch its disk while QEMU writes the
                    # memory (QEMU runs the two in turn under its big lock; the switch is
                    # then no longer part of the pause). A pre-copy switches once stopped.
                    await self._switch_disk(qmp, new_top)
                    switched = True
                info = await wait_migration(qmp, poll_s=0.001)
                t_seen = time.monotonic()
                if not switched:
                    await self._switch_disk(qmp, new_top)
                    switched = True
                if was_running:
                    await qemu_save.cont_after_migration(qmp)
                resumed = time.monotonic()
            # `stream_written` closes the duplicate, also when it fails: it is no longer ours to
            # close below.
            fd, kept = kept, None
            written = qemu_save.stream_written(fd, trim=background)
            if not overwrite:
                os.replace(target, stream)
        except BaseException as exc:
            if kept is not None:
                os.close(kept)
            with contextlib.suppress(Exception):
                status = await qmp.execute("query-status")
                if was_running and isinstance(status, dict) and not status.get("running"):
                    await qemu_save.cont_after_migration(qmp)
            if not overwrite:
                with contextlib.suppress(OSError):
                    target.unlink()
            raise SnapshotFailed(str(exc) or type(exc).__name__, disk_switched=switched) from exc
        finally:
            await qmp.disconnect()
        if stopped_at is not None:
            return SnapshotPause((resumed - stopped_at) * 1000,
                                 "background" if background else "stopped", written)
        downtime = float(info.get("downtime", 0)) if was_running else 0.0
        return SnapshotPause(downtime + (resumed - t_seen) * 1000, "precopy", written)

    async def _switch_disk(self, qmp: QMPClient, new_top: Path) -> None:
        if self.jail is not None:
            await switch_top(qmp, new_top)  # a jailed QEMU opens no file by name
            return
        await qmp.execute("blockdev-snapshot-sync", {
            "device": ROOT_DRIVE, "snapshot-file": str(new_top), "format": "qcow2",
            "mode": "existing"})

    async def save_stopped(self, vm: VMProcess, stream: Path) -> None:
        """Stop the guest and write its whole state (memory included) to `stream`."""
        qmp = await connect_qmp(qmp_socket(vm.paths))
        try:
            await qmp.execute("stop")
            await qemu_save.prepare_save(qmp)
            partial = stream.with_suffix(".partial")
            os.close(await qemu_save.pass_stream_fd(qmp, partial))
            await qemu_save.start_stream(qmp)
            await wait_migration(qmp)
            os.replace(partial, stream)
        finally:
            await qmp.disconnect()

    async def resize_disk(self, vm: VMProcess, size_bytes: int) -> None:
        # The guest kernel learns the new capacity from virtio-blk's config-change interrupt.
        await qmp_pipeline(qmp_socket(vm.paths), [
            ("block_resize", {"device": ROOT_DRIVE, "size": size_bytes})], alive=vm.is_alive)

    async def announce_volumes(self, vm: VMProcess, sizes: Mapping[int, int]) -> None:
        # Resizing a drive to the size it has changes no byte, but QEMU raises virtio-blk's
        # config-change interrupt, and the guest kernel reads the capacity again.
        # Only once the restore's stream is loaded: until then the images are inactive, and
        # QEMU 7.2 aborts on a resize of one (`!(bs->open_flags & BDRV_O_INACTIVE)`).
        if sizes:
            await qmp_pipeline(qmp_socket(vm.paths), [
                ("block_resize", {"device": volume_drive(slot), "size": size})
                for slot, size in sorted(sizes.items())], alive=vm.is_alive)

    # -- live migration (migrate.py) -------------------------------------------------

    async def start_incoming(self, paths: VMPaths, kernel: KernelSpec, shape: MachineShape,
                             disk: Path, *, netns: str | None = None,
                             saved_by: str = "") -> VMProcess:
        for stale in (paths.agent_socket, qmp_socket(paths)):
            stale.unlink(missing_ok=True)
        # Anonymous RAM, like every restore from a stream: the whole memory comes with it.
        # The source runs on its template's machine, so the stream has that machine's devices.
        argv = self._argv(paths, kernel, shape, None, share=False, disk=disk, netns=netns,
                          machine=self.machine_for(saved_by))
        vm = self._spawn([*argv, "-S", "-incoming", "defer"], paths, shape, netns,
                         huge_pages=self.stream_huge_pages)
        try:
            # As a restore: the guest finds the agent port open when it runs here.
            vm.agent_connection = await connect_unix(paths.agent_socket, alive=vm.is_alive)
        except BaseException:
            vm.kill()
            raise
        return vm

    async def accept_incoming(self, vm: VMProcess, sock_fd: int) -> None:
        await qemu_migrate.incoming(vm, sock_fd)

    async def wait_incoming(self, vm: VMProcess, timeout: float) -> None:
        await qemu_migrate.wait_incoming(vm, timeout)

    async def finish_incoming(self, vm: VMProcess) -> None:
        qmp = await connect_qmp(qmp_socket(vm.paths))
        try:
            # `cont` activates the disks first (late-block-activate).
            await qemu_save.cont_after_migration(qmp)
        finally:
            await qmp.disconnect()

    async def migrate_out(self, vm: VMProcess, sock_fd: int, *, converge_s: float,
                          timeout: float) -> MigrationStats:
        return await qemu_migrate.outgoing(vm, sock_fd, live=self.live_precopy(),
                                           converge_s=converge_s, timeout=timeout)

    async def resume_source(self, vm: VMProcess) -> None:
        await qemu_migrate.resume_source(vm)

    async def settle(self, vm: VMProcess, running: bool) -> None:
        await qemu_migrate.settle(vm, running)

    def owns(self, pid: int, paths: VMPaths) -> bool:
        argv = read_cmdline(pid)  # nsenter has exec'd the VMM: argv[0] is the VMM
        if not argv or not argv[0].endswith(Path(self.binary).name):
            return False
        return any(str(paths.agent_socket) in arg for arg in argv)


