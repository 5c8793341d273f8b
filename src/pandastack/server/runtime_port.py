"""What the API needs from a host runtime. `pandastack.host.runtime.HostRuntime` satisfies it
structurally (in-process); a remote host runtime can implement the same protocols later."""

from __future__ import annotations

import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from pandastack.host.agentlink.client import CodeEvent, ExecResult
from pandastack.host.agentlink.files import FileInfo
from pandastack.host.network.manager import NetworkPolicy
from pandastack.host.runtime import SnapshotResult
from pandastack.host.runtime.snapshots import SnapshotInfo

OutputCallback = Callable[[bytes], Awaitable[None] | None]

__all__ = ["CodeEvent", "ExecResult", "FileInfo", "NetworkPolicy", "OutputCallback", "RuntimePort",
           "SandboxPort", "SnapshotCatalog", "SnapshotInfo", "SnapshotResult"]


class SandboxPort(Protocol):
    """One live sandbox (a `SandboxHandle` in-process)."""

    @property
    def id(self) -> str: ...

    @property
    def workdir(self) -> os.PathLike[str]: ...

    @property
    def state(self) -> str:
        """"running", "paused" or "hibernated" (no VM process; a guest operation wakes it)."""
        ...

    def is_alive(self) -> bool: ...

    async def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   stdin: bytes | None = None, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None,
                   user: str | None = None) -> ExecResult: ...

    async def spawn(self, cmd: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, user: str | None = None) -> int: ...

    async def attach(self, pid: int, *, on_stdout: OutputCallback | None = None,
                     on_stderr: OutputCallback | None = None) -> ExecResult: ...

    async def procs(self) -> list[dict[str, object]]: ...

    async def signal(self, pid: int, sig: int) -> None: ...

    async def send_stdin(self, pid: int, data: bytes, *, eof: bool = False) -> None: ...

    def read_file(self, path: str) -> AsyncIterator[bytes]: ...

    async def write_file(self, path: str, data: bytes | AsyncIterable[bytes], *,
                         mode: int = 0o644) -> int: ...

    async def list_dir(self, path: str) -> list[FileInfo]: ...

    async def stat(self, path: str) -> FileInfo: ...

    async def mkdir(self, path: str, *, parents: bool = True) -> None: ...

    async def remove(self, path: str, *, recursive: bool = False) -> None: ...

    async def rename(self, src: str, dst: str) -> None: ...

    def run_code(self, code: str, *, language: str = "python", context_id: str | None = None,
                 timeout: float | None = None,
                 env: Mapping[str, str] | None = None) -> AsyncIterator[CodeEvent]:
        """The events of one run in a code context; the last one is always "end"."""
        ...

    async def create_code_context(self, language: str = "python",
                                  cwd: str | None = None) -> dict[str, object]: ...

    async def list_code_contexts(self) -> list[dict[str, object]]: ...

    async def delete_code_context(self, context_id: str) -> None: ...

    async def restart_code_context(self, context_id: str) -> None: ...


class SnapshotCatalog(Protocol):
    """The snapshots a runtime holds (`SnapshotStore` in-process)."""

    def get(self, snapshot_id: str) -> SnapshotInfo: ...

    def all(self, *, include_internal: bool = False) -> list[SnapshotInfo]: ...


class RuntimePort(Protocol):
    """Creates, finds and kills sandboxes; pauses, snapshots, forks and hibernates them.
    `start()` re-adopts VMs that are still running and sandboxes that are hibernated."""

    async def start(self) -> object: ...

    async def close(self) -> None: ...

    async def create(self, template: str = "base", *, vcpus: int = 1, memory_mb: int = 512,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None) -> SandboxPort: ...

    async def prepare_template(self, name: str, *, vcpus: int = 1,
                               memory_mb: int = 512) -> None:
        """Build built-in template `name` for that shape if it is not built yet (minutes on
        a fresh host); TemplateNotFound for unknown names."""
        ...

    def get(self, sandbox_id: str) -> SandboxPort: ...

    def list(self) -> Sequence[SandboxPort]: ...

    async def kill(self, sandbox_id: str) -> None: ...

    async def pause(self, sandbox_id: str) -> None: ...

    async def resume(self, sandbox_id: str) -> None: ...

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult: ...

    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[SandboxPort]: ...

    async def hibernate(self, sandbox_id: str) -> None: ...

    async def wake(self, sandbox_id: str) -> None: ...

    def delete_snapshot(self, snapshot_id: str) -> None: ...

    async def update_network(self, sandbox_id: str, network: NetworkPolicy) -> NetworkPolicy:
        """Replace the egress policy (new connections follow it at once)."""
        ...

    def describe(self, sandbox_id: str) -> dict[str, object]:
        """What the runtime knows of the sandbox; of it the API reads `"network"` (the policy
        as a dict) and `"slot"` (an object whose `ns_ip` is the address that reaches the
        guest's TCP ports, or None when the sandbox has no network)."""
        ...

    @property
    def snapshots(self) -> SnapshotCatalog: ...
