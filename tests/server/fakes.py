"""An in-memory runtime that satisfies `RuntimePort`, for fast tests of the HTTP layer (auth,
errors, validation, lifecycle bookkeeping). Everything about real VMs is tested with real VMs."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from pathlib import Path

from pandastack.host.agent_client import ExecResult, FileInfo
from pandastack.host.errors import GuestOSError, SandboxNotFound, TemplateNotFound
from pandastack.server.runtime_port import OutputCallback


class FakeSandbox:
    def __init__(self, sandbox_id: str, workdir: Path) -> None:
        self.id = sandbox_id
        self._workdir = workdir
        self.alive = True
        self.files: dict[str, bytes] = {}
        self.last_env: Mapping[str, str] | None = None

    @property
    def workdir(self) -> os.PathLike[str]:
        return self._workdir

    def is_alive(self) -> bool:
        return self.alive

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
    ) -> ExecResult:
        self.last_env = env
        text = cmd if isinstance(cmd, str) else " ".join(cmd)
        out = text.encode() + b"\xff"  # one invalid UTF-8 byte: decoded with replacement
        if on_stdout is not None:
            r = on_stdout(out)
            if r is not None:
                await r
        return ExecResult(0, out, b"", 1.0, False, None, False)

    async def spawn(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        return 42

    async def attach(
        self,
        pid: int,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        return ExecResult(0, b"", b"", 1.0, False, None, False)

    async def procs(self) -> list[dict[str, object]]:
        return [{"pid": 42, "cmd": "sleep 1", "running": True, "exit_code": None}]

    async def signal(self, pid: int, sig: int) -> None:
        if pid != 42:
            raise GuestOSError("ESRCH", f"no managed process {pid}")

    async def send_stdin(self, pid: int, data: bytes, *, eof: bool = False) -> None:
        await self.signal(pid, 0)

    async def read_file(self, path: str) -> AsyncIterator[bytes]:
        if path not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", path)
        yield self.files[path]

    async def write_file(
        self, path: str, data: bytes | AsyncIterable[bytes], *, mode: int = 0o644
    ) -> int:
        buf = data if isinstance(data, bytes) else b"".join([c async for c in data])
        self.files[path] = buf
        return len(buf)

    async def list_dir(self, path: str) -> list[FileInfo]:
        return [await self.stat(p) for p in self.files if p.rsplit("/", 1)[0] == path]

    async def stat(self, path: str) -> FileInfo:
        if path not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", path)
        return FileInfo(
            path.rsplit("/", 1)[-1], path, "file", len(self.files[path]), 0o644, time.time()
        )

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        if path in self.files:
            raise GuestOSError("EEXIST", "File exists", path)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        if self.files.pop(path, None) is None:
            raise GuestOSError("ENOENT", "No such file or directory", path)

    async def rename(self, src: str, dst: str) -> None:
        if src not in self.files:
            raise GuestOSError("ENOENT", "No such file or directory", src)
        self.files[dst] = self.files.pop(src)


class FakeRuntime:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.killed: list[str] = []

    async def start(self) -> object:
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
    ) -> FakeSandbox:
        if template != "base":
            raise TemplateNotFound(f"unknown template {template!r}")
        if disk_mb is not None and disk_mb < 2048:
            raise ValueError("disk_mb must be at least 2048")
        assert sandbox_id is not None
        sbx = FakeSandbox(sandbox_id, self.root / sandbox_id)
        self.sandboxes[sandbox_id] = sbx
        return sbx

    def get(self, sandbox_id: str) -> FakeSandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    def list(self) -> list[FakeSandbox]:
        return list(self.sandboxes.values())

    async def kill(self, sandbox_id: str) -> None:
        if self.sandboxes.pop(sandbox_id, None) is None:
            raise SandboxNotFound(sandbox_id)
        self.killed.append(sandbox_id)
