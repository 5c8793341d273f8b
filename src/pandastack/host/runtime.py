"""The in-process host runtime: create sandboxes by restoring templates, find them, kill them.

Every sandbox owns exactly one directory under the state dir (its disk layer, sockets, logs and
`sandbox.json`) and one VMM process, started in its own session so that it outlives this
process. Kill removes both. `start()` re-adopts the VMs that are still running and removes the
remains of dead ones, so a crash or restart of the host process loses nothing and leaks nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .accel import resolve_accel
from .config import HostConfig
from .disk import create_overlay
from .errors import HostError, SandboxNotFound, SetupError
from .images import GuestImage, ensure_base_image
from .qemu import QemuDriver
from .sandbox import SandboxHandle
from .templates import Template, TemplateStore
from .vmm import KernelSpec, MachineShape, VMMDriver, VMPaths, VMProcess, read_cmdline

SANDBOX_ID_RE = re.compile(r"^sbx-[0-9a-f]{12}$")
MAX_VCPUS = 8
MAX_MEMORY_MB = 16384
MIN_MEMORY_MB = 128
MAX_DISK_MB = 1 << 20
MIB = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SandboxRecord:
    """What is persisted about a sandbox, enough to re-adopt it after a restart."""

    id: str
    template: str
    template_key: str
    vcpus: int
    memory_mb: int
    disk_bytes: int
    hostname: str
    machine_id: str
    created_at: float
    pid: int | None = None

    @classmethod
    def load(cls, path: Path) -> SandboxRecord:
        data = json.loads(path.read_text())
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)


@dataclass(frozen=True)
class AdoptReport:
    adopted: list[str]
    cleaned: list[str]


class HostRuntime:
    """Single-machine runtime. Use `async with HostRuntime(...) as rt:` or start()/close()."""

    def __init__(self, config: HostConfig | None = None, *, progress: Progress = print):
        self.config = config or HostConfig.from_env()
        self.progress = progress
        self._sandboxes: dict[str, SandboxHandle] = {}
        self._image: GuestImage | None = None
        self._driver: VMMDriver | None = None
        self._templates: TemplateStore | None = None
        self._prepare_lock = asyncio.Lock()

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
        """Make sure the guest image exists and pick the accelerator (cached after first run)."""
        async with self._prepare_lock:
            if self._templates is None:
                image = await asyncio.to_thread(ensure_base_image, self.config.home,
                                                progress=self.progress)
                kernel = KernelSpec(image.kernel, image.initrd, image.cmdline)
                accel = await asyncio.to_thread(resolve_accel, self.config.accel, kernel,
                                                self.config.cache_dir, self.config.qemu_binary)
                self._image = image
                self._driver = QemuDriver(accel, binary=self.config.qemu_binary,
                                          tb_size_mb=self.config.tb_size_mb,
                                          tcg_cpu=self.config.tcg_cpu)
                self._templates = TemplateStore(self.config.templates_dir, self._driver, image)
            return self._templates

    @property
    def driver(self) -> VMMDriver:
        if self._driver is None:
            raise HostError("runtime not prepared")
        return self._driver

    async def ensure_template(self, name: str = "base",
                              shape: MachineShape | None = None) -> Template:
        store = await self.prepare()
        return await store.ensure(name, shape, progress=self.progress)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> AdoptReport:
        """Re-adopt running sandboxes from the state dir and clean up dead ones."""
        self.sandboxes_dir.mkdir(parents=True, exist_ok=True)
        await self.prepare()
        adopted: list[str] = []
        cleaned: list[str] = []
        running = self._scan_vmm_processes()
        for entry in sorted(self.sandboxes_dir.iterdir()):
            if not entry.is_dir() or entry.name in self._sandboxes:
                continue
            paths = VMPaths(entry)
            pid = running.pop(entry.name, None)
            record = _try_load(entry / "sandbox.json")
            if pid is not None and record is not None and self.driver.owns(pid, paths):
                handle = SandboxHandle(record.id, VMProcess(pid, paths), record.hostname,
                                       record.created_at, self.config.agent_timeout_s,
                                       template=record.template)
                self._sandboxes[record.id] = handle
                adopted.append(record.id)
                continue
            if pid is not None:
                VMProcess(pid, paths).kill()
            await asyncio.to_thread(shutil.rmtree, entry, True)
            cleaned.append(entry.name)
        for name, pid in running.items():  # VMM processes whose directory is already gone
            VMProcess(pid, VMPaths(self.sandboxes_dir / name)).kill()
            cleaned.append(name)
        return AdoptReport(adopted, cleaned)

    def _scan_vmm_processes(self) -> dict[str, int]:
        """Map sandbox id -> pid for every live VMM process that belongs to our state dir."""
        prefix = str(self.sandboxes_dir) + "/"
        found: dict[str, int] = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            for arg in read_cmdline(int(proc.name)):
                idx = arg.find(prefix)
                if idx != -1 and "agent.sock" in arg:
                    name = arg[idx + len(prefix):].split("/", 1)[0]
                    if SANDBOX_ID_RE.match(name):
                        found[name] = int(proc.name)
                    break
        return found

    async def create(self, template: str = "base", *, vcpus: int = 1, memory_mb: int = 512,
                     disk_mb: int | None = None,
                     sandbox_id: str | None = None) -> SandboxHandle:
        """Restore a new sandbox from `template` and return once its agent is ready.

        `disk_mb` grows the root filesystem beyond the template's size (online, after the
        restore, so only creates that ask for it pay for it); smaller is refused.
        """
        if not 1 <= vcpus <= MAX_VCPUS:
            raise ValueError(f"vcpus must be between 1 and {MAX_VCPUS}")
        if not MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB:
            raise ValueError(f"memory_mb must be between {MIN_MEMORY_MB} and {MAX_MEMORY_MB}")
        if disk_mb is not None and not 0 < disk_mb <= MAX_DISK_MB:
            raise ValueError(f"disk_mb must be between 1 and {MAX_DISK_MB}")
        tmpl = await self.ensure_template(template, MachineShape(vcpus, memory_mb))
        disk_bytes = tmpl.disk_bytes if disk_mb is None else disk_mb * MIB
        if disk_bytes < tmpl.disk_bytes:
            raise ValueError(f"disk_mb must be at least {tmpl.disk_bytes // MIB} "
                             f"(the size of template {template!r})")
        sid = sandbox_id or f"sbx-{secrets.token_hex(6)}"
        if not SANDBOX_ID_RE.match(sid):
            raise ValueError(f"invalid sandbox id {sid!r}")
        workdir = self.sandboxes_dir / sid
        workdir.mkdir(parents=True, exist_ok=False)
        record = SandboxRecord(
            id=sid, template=template, template_key=tmpl.key, vcpus=vcpus,
            memory_mb=memory_mb, disk_bytes=disk_bytes, hostname=sid,
            machine_id=uuid.uuid4().hex, created_at=time.time(),
        )
        paths = VMPaths(workdir)
        vm: VMProcess | None = None
        try:
            disk = workdir / "disk.qcow2"
            create_overlay(disk, tmpl.disk, tmpl.disk_bytes)
            vm = await self.driver.restore(paths, tmpl.snapshot, disk)
            record = SandboxRecord(**{**asdict(record), "pid": vm.pid})
            record.save(workdir / "sandbox.json")
            handle = SandboxHandle(sid, vm, record.hostname, record.created_at,
                                   self.config.agent_timeout_s, template=template)
            await handle.initialize(record.machine_id)
            if disk_bytes > tmpl.disk_bytes:
                await self.driver.resize_disk(vm, disk_bytes)
                grown = await handle.exec(["resize2fs", "/dev/vda"], timeout=120)
                if grown.exit_code != 0:
                    raise SetupError(f"growing the root filesystem failed: {grown.stderr!r}")
        except BaseException as exc:
            if vm is not None:
                vm.kill()
            await asyncio.to_thread(shutil.rmtree, workdir, True)
            if isinstance(exc, HostError | ValueError):
                raise
            if isinstance(exc, Exception):
                raise SetupError(f"create from {template!r} failed: {exc}") from exc
            raise
        self._sandboxes[sid] = handle
        return handle

    def get(self, sandbox_id: str) -> SandboxHandle:
        try:
            return self._sandboxes[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    def list(self) -> list[SandboxHandle]:
        return list(self._sandboxes.values())

    async def kill(self, sandbox_id: str) -> None:
        handle = self._sandboxes.pop(sandbox_id, None)
        if handle is None:
            raise SandboxNotFound(sandbox_id)
        await handle.destroy()

    async def kill_all(self) -> None:
        for sid in list(self._sandboxes):
            await self.kill(sid)

    async def close(self) -> None:
        """Drop agent connections; the VMs keep running and a later start() re-adopts them."""
        for handle in self._sandboxes.values():
            await handle.disconnect()
        self._sandboxes.clear()


def _try_load(path: Path) -> SandboxRecord | None:
    try:
        return SandboxRecord.load(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None
