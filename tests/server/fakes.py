"""An in-memory runtime that satisfies `RuntimePort`, for fast tests of the HTTP layer (auth,
errors, validation, lifecycle bookkeeping). Everything about real VMs is tested with real VMs."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pandastack.guestproto.ops import GlobResult, GrepMatch, GrepResult
from pandastack.hostport.errors import (
    BuildFailed,
    CodeContextNotFound,
    GuestOSError,
    HostError,
    NoObjectStore,
    SandboxNotFound,
    SandboxStateError,
    SnapshotNotFound,
    TemplateNotFound,
    VolumeInUse,
    VolumeNotFound,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import (
    BuildLog,
    DroppedCallback,
    OutputCallback,
    PidCallback,
    SandboxPlacement,
)
from pandastack.hostport.pty import PtySession
from pandastack.hostport.registries import RegistryLogin, RegistryLogins
from pandastack.hostport.results import (
    BuildResult,
    CodeEvent,
    ExecResult,
    FileInfo,
    ForkChildren,
    GuestMetrics,
    ImageInfo,
    SnapshotInfo,
    SnapshotResult,
)
from pandastack.hostport.volumes import HostVolume, VolumeBackup, VolumeMountRequest
from pandastack.hostport.watch import WatchEvent
from pandastack.rules import MAX_VOLUME_MB, MIN_VOLUME_MB, clone_volume_id
from pandastack.templatespec import TemplateSpec

MAX_FORK = 16


class FakeSandbox:
    def __init__(self, sandbox_id: str, workdir: Path, runtime: FakeRuntime | None = None,
                 template: str = "base", vcpus: int = 1, memory_mb: int = 512) -> None:
        self.id = sandbox_id
        self._workdir = workdir
        self.runtime = runtime
        self.template = template
        self.vcpus = vcpus
        self.memory_mb = memory_mb
        self.alive = True
        self.state = "running"
        self.forked_from: str | None = None
        self.files: dict[str, bytes] = {}
        self.last_env: Mapping[str, str] | None = None
        self.last_max_output: int | None = None
        self.spawn_timeout: float | None = None
        self.wakes = 0
        self.boots = 0
        self.network = NetworkPolicy()
        self.code_contexts: dict[str, dict[str, object]] = {}
        self.volumes: list[VolumeMountRequest] = []

    @property
    def workdir(self) -> os.PathLike[str]:
        return self._workdir

    def is_alive(self) -> bool:
        return self.alive and self.state != "hibernated"

    async def _guest(self) -> None:
        """As `SandboxHandle.agent()`: a hibernated sandbox wakes, a paused one refuses."""
        if self.state == "hibernated" and self.runtime is not None:
            await self.runtime.wake(self.id)
        if self.state == "paused":
            raise SandboxStateError(f"sandbox {self.id} is paused; resume it first")

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        user: str | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        await self._guest()
        self.last_env = env
        self.last_max_output = max_output
        text = cmd if isinstance(cmd, str) else " ".join(cmd)
        out = text.encode() + b"\xff"  # one invalid UTF-8 byte: decoded with replacement
        if on_stdout is not None:
            r = on_stdout(out)
            if r is not None:
                await r
        keep = len(out) if max_output is None else max_output
        return ExecResult(0, out[:keep], b"", 1.0, False, None, len(out) > keep)

    # The in-memory host has no terminals (they are tested on real VMs): a clear refusal.
    async def pty_create(self, *, cols: int, rows: int, cmd: str | Sequence[str] | None = None,
                         env: Mapping[str, str] | None = None, cwd: str | None = None,
                         user: str | None = None) -> int:
        await self._guest()
        raise GuestOSError("ENOTSUP", "the in-memory host has no terminals", None)

    async def pty_connect(self, pid: int) -> PtySession:
        await self._guest()
        raise GuestOSError("ESRCH", f"no terminal {pid}", None)

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
    ) -> int:
        await self._guest()
        self.spawn_timeout = timeout
        return 42

    async def attach(
        self,
        pid: int,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        on_dropped: DroppedCallback | None = None,
        keep_output: bool = True,
    ) -> ExecResult:
        await self._guest()
        # A stream sees a replay note, one chunk of each stream, then the exit.
        for callback, args in ((on_dropped, (3, 0)), (on_stdout, (b"out\n",)),
                               (on_stderr, (b"err\n",))):
            if callback is not None:
                r = callback(*args)
                if r is not None:
                    await r
        return ExecResult(0, b"", b"", 1.0, False, None, False)

    async def spawn_attach(
        self,
        cmd: str | Sequence[str],
        *,
        on_spawned: PidCallback,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        stdin: bool = True,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        keep_output: bool = True,
    ) -> ExecResult:
        # a spawn's pid first, then what an attach to it would stream
        told = on_spawned(await self.spawn(cmd, env=env, cwd=cwd, user=user, timeout=timeout))
        if told is not None:
            await told
        return await self.attach(42, on_stdout=on_stdout, on_stderr=on_stderr,
                                 keep_output=keep_output)

    async def procs(self) -> list[dict[str, object]]:
        await self._guest()
        return [{"pid": 42, "cmd": "sleep 1", "running": True, "exit_code": None}]

    async def signal(self, pid: int, sig: int) -> None:
        await self._guest()
        if pid != 42:
            raise GuestOSError("ESRCH", f"no managed process {pid}")

    async def send_stdin(self, pid: int, data: bytes, *, eof: bool = False) -> None:
        await self.signal(pid, 0)

    async def read_file(self, path: str) -> AsyncIterator[bytes]:
        await self._guest()
        if path not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", path)
        yield self.files[path]

    async def write_file(
        self, path: str, data: bytes | AsyncIterable[bytes], *, mode: int = 0o644
    ) -> int:
        await self._guest()
        buf = data if isinstance(data, bytes) else b"".join([c async for c in data])
        self.files[path] = buf
        return len(buf)

    async def list_dir(self, path: str) -> list[FileInfo]:
        await self._guest()
        return [await self.stat(p) for p in self.files if p.rsplit("/", 1)[0] == path]

    async def watch(self, path: str, *,
                    recursive: bool = True) -> AsyncIterator[list[WatchEvent]]:
        """Scripted: ENOENT for /missing; a create and a rename, then the directory is gone
        (or, for a path ending in "flood", an overflow)."""
        await self._guest()
        if path == "/missing":
            raise GuestOSError("ENOENT", "No such file or directory", path)
        yield [WatchEvent("watching", path)]
        yield [WatchEvent("create", f"{path}/a"),
               WatchEvent("rename", f"{path}/b", f"{path}/a")]
        if path.endswith("flood"):
            yield [WatchEvent("overflow", path)]

    async def stat(self, path: str) -> FileInfo:
        await self._guest()
        if path not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", path)
        return FileInfo(
            path.rsplit("/", 1)[-1], path, "file", len(self.files[path]), 0o644, time.time()
        )

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        await self._guest()
        if path in self.files:
            raise GuestOSError("EEXIST", "File exists", path)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._guest()
        if self.files.pop(path, None) is None:
            raise GuestOSError("ENOENT", "No such file or directory", path)

    async def rename(self, src: str, dst: str) -> None:
        await self._guest()
        if src not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", src)
        self.files[dst] = self.files.pop(src)

    def _under(self, path: str) -> list[str]:
        found = sorted(p for p in self.files if p.startswith(path.rstrip("/") + "/"))
        if not found and path not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", path)
        return found or [path]

    async def grep(self, path: str, pattern: str, *, ignore_case: bool = False) -> GrepResult:
        """Lines of the files under `path` (no bounds: the guest's are tested on VMs)."""
        await self._guest()
        fold = str.lower if ignore_case else str
        return GrepResult([
            GrepMatch(p, n, line) for p in self._under(path)
            for n, line in enumerate(self.files[p].decode(errors="surrogateescape").split("\n"), 1)
            if fold(pattern) in fold(line)], truncated=False)

    async def glob(self, path: str, pattern: str) -> GlobResult:
        """fnmatch of the paths under `path` (its `*` crosses `/`, unlike the guest's)."""
        await self._guest()
        prefix = path.rstrip("/") + "/"
        return GlobResult([p for p in self._under(path) if p.startswith(prefix)
                           and fnmatch.fnmatchcase(p.removeprefix(prefix), pattern)], False)

    async def run_code(self, code: str, *, language: str = "python",
                       context_id: str | None = None, timeout: float | None = None,
                       env: Mapping[str, str] | None = None) -> AsyncIterator[CodeEvent]:
        """Echoes the code as stdout and returns one text result; "raise" gives an error."""
        await self._guest()
        if context_id is not None and context_id not in self.code_contexts:
            raise CodeContextNotFound(context_id)
        yield CodeEvent("stdout", text=code)
        if code.startswith("raise"):
            yield CodeEvent("error", name="Exception", value="raised", traceback="tb")
        else:
            yield CodeEvent("result", data={"text/plain": "ok"}, is_main_result=True)
        yield CodeEvent("end", execution_count=1)

    async def create_code_context(self, language: str = "python",
                                  cwd: str | None = None) -> dict[str, object]:
        await self._guest()
        cid = f"ctx-{secrets.token_hex(4)}"
        self.code_contexts[cid] = {"id": cid, "language": language, "cwd": cwd}
        return self.code_contexts[cid]

    async def list_code_contexts(self) -> list[dict[str, object]]:
        await self._guest()
        return list(self.code_contexts.values())

    async def delete_code_context(self, context_id: str) -> None:
        await self._guest()
        if self.code_contexts.pop(context_id, None) is None:
            raise CodeContextNotFound(context_id)

    async def restart_code_context(self, context_id: str) -> None:
        await self._guest()
        if context_id not in self.code_contexts:
            raise CodeContextNotFound(context_id)

    async def metrics(self, window_ms: int = 200) -> GuestMetrics:
        """Figures that follow the sandbox's shape and what it holds in `files`: each file
        adds 10 % CPU and its bytes to memory (a test moves the figures by writing files)."""
        await self._guest()
        used = sum(len(b) for b in self.files.values())
        total = self.memory_mb << 20
        return GuestMetrics(cpu_percent=min(100.0, 1.5 + 10.0 * len(self.files)),
                            cpu_count=self.vcpus, memory_used_bytes=min(total, (64 << 20) + used),
                            memory_total_bytes=total,
                            disk_used_bytes=used, disk_total_bytes=1 << 30, window_ms=window_ms)


class FakeSnapshots:
    def __init__(self) -> None:
        self.infos: dict[str, SnapshotInfo] = {}
        self.files: dict[str, dict[str, bytes]] = {}

    def get(self, snapshot_id: str) -> SnapshotInfo:
        try:
            return self.infos[snapshot_id]
        except KeyError:
            raise SnapshotNotFound(snapshot_id) from None

    def all(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        return [i for i in self.infos.values() if include_internal or not i.internal]


@dataclass
class FakeVolume:
    id: str
    size_mb: int
    created_at: float
    source: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)


class FakeRuntime:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sandboxes: dict[str, FakeSandbox] = {}
        # Volumes as a host holds them; a snapshot's mounts, as the host records them.
        self.volumes: dict[str, FakeVolume] = {}
        self.snapshot_mounts: dict[str, list[VolumeMountRequest]] = {}
        self.fail_create: BaseException | None = None
        self.killed: list[str] = []
        self.snapshots = FakeSnapshots()
        self.fail_snapshot: BaseException | None = None
        self.fail_fork: BaseException | None = None
        self.fail_wake: BaseException | None = None
        # Where describe() says every sandbox's ports are (None: no network, as before).
        self.ns_ip: str | None = None
        # Set: prepare_template() waits for it, as a first use that builds the template does.
        self.template_built: asyncio.Event | None = None
        # Template builds (None: the host refuses them, as one without images would).
        self.builder: ScriptedBuilder | None = None
        # The registry logins each build was handed, in order.
        self.build_logins: list[dict[str, RegistryLogin]] = []
        # What inspect_image answers for a reference (an ImageError: raised); any other
        # reference is an image without exposed ports. Every reference asked is recorded.
        self.images: dict[str, ImageInfo | HostError] = {}
        self.inspected: list[str] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        pass

    async def create(
        self,
        template: str = "base",
        *,
        vcpus: int = 1,
        memory_mb: int = 512,
        disk_mb: int | None = None,
        sandbox_id: str | None = None,
        snapshot: str | None = None,
        network: NetworkPolicy | None = None,
        volumes: Sequence[VolumeMountRequest] = (),
    ) -> FakeSandbox:
        files: dict[str, bytes] = {}
        for mount in volumes:
            self.volume(mount.volume_id)
        if self.fail_create is not None:
            raise self.fail_create
        if snapshot is not None:
            info = self.snapshots.get(snapshot)
            template, vcpus, memory_mb = info.template, info.vcpus, info.memory_mb
            files = dict(self.snapshots.files[snapshot])
        if template != "base":
            raise TemplateNotFound(f"unknown template {template!r}")
        if disk_mb is not None and disk_mb < 2048:
            raise ValueError("disk_mb must be at least 2048")
        sandbox_id = sandbox_id or f"sbx-{secrets.token_hex(6)}"
        sbx = FakeSandbox(sandbox_id, self.root / sandbox_id, self, template, vcpus, memory_mb)
        sbx.files = files
        sbx.network = network or NetworkPolicy()
        sbx.volumes = list(volumes)
        if snapshot is not None:  # read-write volumes come as copies, as the host makes them
            sbx.volumes = [self._restored(m, sandbox_id)
                           for m in self.snapshot_mounts.get(snapshot, [])]
        self.sandboxes[sandbox_id] = sbx
        return sbx

    def _restored(self, mount: VolumeMountRequest, sandbox_id: str) -> VolumeMountRequest:
        if mount.read_only:
            return mount
        source = self.volumes.get(mount.volume_id)
        copy = FakeVolume(clone_volume_id(mount.volume_id, sandbox_id),
                          source.size_mb if source else MIN_VOLUME_MB, time.time(),
                          mount.volume_id, dict(source.files) if source else {})
        self.volumes[copy.id] = copy
        return VolumeMountRequest(copy.id, mount.mount_path, False)

    # -- volumes (VolumePort) ---------------------------------------------------------------

    def volume(self, volume_id: str) -> FakeVolume:
        try:
            return self.volumes[volume_id]
        except KeyError:
            raise VolumeNotFound(volume_id) from None

    def mounted_by(self, volume_id: str) -> tuple[str, ...]:
        return tuple(sid for sid, sbx in self.sandboxes.items()
                     if any(m.volume_id == volume_id for m in sbx.volumes))

    def _host_volume(self, vol: FakeVolume) -> HostVolume:
        return HostVolume(vol.id, vol.size_mb, vol.created_at, vol.source,
                          self.mounted_by(vol.id))

    async def create_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        if not MIN_VOLUME_MB <= size_mb <= MAX_VOLUME_MB:
            raise ValueError(f"size_mb must be between {MIN_VOLUME_MB} and {MAX_VOLUME_MB}")
        self.volumes[volume_id] = FakeVolume(volume_id, size_mb, time.time())
        return self._host_volume(self.volumes[volume_id])

    async def get_volume(self, volume_id: str) -> HostVolume:
        return self._host_volume(self.volume(volume_id))

    async def list_volumes(self) -> list[HostVolume]:
        return [self._host_volume(v) for v in self.volumes.values()]

    async def resize_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        vol = self.volume(volume_id)
        if self.mounted_by(volume_id):
            raise VolumeInUse(f"volume {volume_id} is mounted")
        if size_mb < vol.size_mb:
            raise ValueError("a volume cannot shrink")
        vol.size_mb = size_mb
        return self._host_volume(vol)

    async def delete_volume(self, volume_id: str) -> None:
        self.volume(volume_id)
        if self.mounted_by(volume_id):
            raise VolumeInUse(f"volume {volume_id} is mounted")
        del self.volumes[volume_id]

    # Volume backups: this fake host has no object store, as a single host without one.
    async def backup_volume(self, volume_id: str, backup_id: str) -> VolumeBackup:
        self.volume(volume_id)
        raise NoObjectStore("this host has no object store")

    async def restore_volume(self, backup_id: str, volume_id: str) -> HostVolume:
        raise NoObjectStore("this host has no object store")

    async def delete_volume_backup(self, backup_id: str) -> None:
        raise NoObjectStore("this host has no object store")

    async def prepare_template(self, name: str, *, vcpus: int = 1,
                               memory_mb: int = 512) -> None:
        if name != "base":
            raise TemplateNotFound(f"unknown template {name!r}")
        if self.template_built is not None:  # a first use that has to build the template
            await self.template_built.wait()

    def sandbox(self, sandbox_id: str) -> FakeSandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    async def get(self, sandbox_id: str) -> FakeSandbox:
        return self.sandbox(sandbox_id)

    def handle(self, sandbox_id: str) -> FakeSandbox:
        return self.sandbox(sandbox_id)

    async def list_sandboxes(self) -> list[FakeSandbox]:
        return list(self.sandboxes.values())

    async def kill(self, sandbox_id: str) -> None:
        if self.sandboxes.pop(sandbox_id, None) is None:
            raise SandboxNotFound(sandbox_id)
        self.killed.append(sandbox_id)

    def _awake(self, sandbox_id: str) -> FakeSandbox:
        sbx = self.sandbox(sandbox_id)
        if sbx.state not in ("running", "paused"):
            raise SandboxStateError(f"sandbox {sandbox_id} is {sbx.state}")
        return sbx

    async def pause(self, sandbox_id: str) -> None:
        self._awake(sandbox_id).state = "paused"

    async def resume(self, sandbox_id: str) -> None:
        self._awake(sandbox_id).state = "running"

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult:
        sbx = self._awake(sandbox_id)
        if self.fail_snapshot is not None:
            raise self.fail_snapshot
        sid = f"snap-{secrets.token_hex(6)}"
        info = SnapshotInfo(
            id=sid, name=name, source=sandbox_id, template=sbx.template,
            template_path="/nonexistent", vcpus=sbx.vcpus, memory_mb=sbx.memory_mb,
            disk_bytes=2048 << 20, layers=("layer-0",), created_at=time.time(),
            state_bytes=1234, internal=internal, size_bytes=4096)
        self.snapshots.infos[sid] = info
        self.snapshots.files[sid] = dict(sbx.files)
        self.snapshot_mounts[sid] = list(sbx.volumes)
        return SnapshotResult(info, 1.5)

    async def fork(self, sandbox_id: str, count: int = 1) -> ForkChildren[FakeSandbox]:
        if not 1 <= count <= MAX_FORK:
            raise ValueError(f"count must be between 1 and {MAX_FORK}")
        snap = await self.snapshot(sandbox_id, internal=True)
        try:
            if self.fail_fork is not None:
                raise self.fail_fork
            policy = self.sandbox(sandbox_id).network
            children = [await self.create(snapshot=snap.info.id, network=policy)
                        for _ in range(count)]
            for child in children:
                child.forked_from = sandbox_id
            return ForkChildren(children, snap.pause_ms)
        finally:
            await self.delete_snapshot(snap.info.id)

    async def hibernate(self, sandbox_id: str) -> None:
        self._awake(sandbox_id).state = "hibernated"

    async def wake(self, sandbox_id: str) -> None:
        sbx = self.sandbox(sandbox_id)
        if sbx.state == "hibernated":
            if self.fail_wake is not None:
                raise self.fail_wake
            sbx.state = "running"
            sbx.wakes += 1
        elif not sbx.alive:  # as the host boots a stopped sandbox's disk (ADR 0037)
            sbx.alive, sbx.state = True, "running"
            sbx.boots += 1

    async def delete_snapshot(self, snapshot_id: str) -> None:
        if self.snapshots.infos.pop(snapshot_id, None) is None:
            raise SnapshotNotFound(snapshot_id)
        self.snapshots.files.pop(snapshot_id, None)

    async def update_network(self, sandbox_id: str, network: NetworkPolicy) -> NetworkPolicy:
        self.sandbox(sandbox_id).network = network
        return network

    async def placement(self, sandbox_id: str) -> SandboxPlacement:
        return SandboxPlacement(network=self.sandbox(sandbox_id).network, ns_ip=self.ns_ip)

    async def console_log(self, sandbox_id: str, max_bytes: int) -> bytes:
        path = Path(self.sandbox(sandbox_id).workdir) / "console.log"
        return path.read_bytes()[-max_bytes:] if path.exists() else b""

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return self.snapshots.get(snapshot_id)

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        return self.snapshots.all(include_internal=include_internal)

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None, vcpus: int = 1,
                             memory_mb: int = 512, cache_scope: str = "",
                             registry_logins: RegistryLogins | None = None) -> BuildResult:
        if self.builder is None:
            raise HostError("this host cannot build templates")
        self.build_logins.append(dict(registry_logins or {}))
        return await self.builder.build(spec, log=log, network=network, vcpus=vcpus,
                                        memory_mb=memory_mb, cache_scope=cache_scope)

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        return []

    async def inspect_image(self, reference: str, *,
                            registry_logins: RegistryLogins | None = None) -> ImageInfo:
        self.inspected.append(reference)
        known = self.images.get(reference)
        if isinstance(known, HostError):
            raise known
        return known or ImageInfo(reference, "sha256:" + "0" * 64, "sha256:" + "0" * 64, 1, 1)


@dataclass
class ScriptedBuilder:
    """Builds that snapshot a fake sandbox (once `release` is set, when `gated`); a spec whose
    first run step is "fail" fails like a real failed step."""

    runtime: FakeRuntime
    gated: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    shapes: list[tuple[int, int]] = field(default_factory=list)
    scopes: list[str] = field(default_factory=list)
    specs: list[TemplateSpec] = field(default_factory=list)  # as the host was handed them
    extra_bytes: int = 0  # what each build reports storing beyond its snapshot's files

    async def build(self, spec: TemplateSpec, *, log: Any, network: NetworkPolicy | None = None,
                    vcpus: int = 1, memory_mb: int = 512, cache_scope: str = "") -> BuildResult:
        self.specs.append(spec)
        self.shapes.append((vcpus, memory_mb))
        self.scopes.append(cache_scope)
        log("Step 1/1 RUN something")
        if self.gated:
            await self.release.wait()
        steps = spec.model_dump()["steps"]
        if steps and steps[0].get("command") == "fail":
            raise BuildFailed("step 1/1 RUN fail failed with exit code 3; last output:\nboom",
                              step=1, instruction="RUN fail", exit_code=3, output="boom")
        sbx = await self.runtime.create("base", vcpus=vcpus, memory_mb=memory_mb)
        snap = await self.runtime.snapshot(sbx.id, internal=True)
        await self.runtime.kill(sbx.id)
        log("built")
        image = self.runtime.images.get(spec.from_template)
        ports = image.exposed_ports if isinstance(image, ImageInfo) else ()
        return BuildResult(snap.info.id, {"FROM_TEMPLATE": "1"}, "/srv", None, None, 1, 0, 0.1,
                           exposed_ports=ports, size_bytes=snap.info.size_bytes + self.extra_bytes)
