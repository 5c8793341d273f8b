"""What the runtime's operations that live in their own modules (snapshots and forks in
`saving`, `hibernation`, `migration`, `transfer`, `recovery`) use of the runtime that runs
them: its parts and the steps they share with create and kill. `HostRuntime` (`core`) is the
one implementation; these modules name this protocol, never `core`, so that `core` imports them
and nothing imports `core` back (the import contract "the runtime's parts never import its
core", ADR 0043). The sandboxes themselves are reached through `table` only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pandastack.host.config import HostConfig
from pandastack.host.memory.admission import MemoryAdmission
from pandastack.host.memory.fork_buffer import ForkBuffer
from pandastack.host.network.manager import NetworkManager
from pandastack.host.runtime.disk_layers import LayerMerges
from pandastack.host.runtime.records import SandboxRecord
from pandastack.host.runtime.remote import RemoteState
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.runtime.slots import SandboxSlots
from pandastack.host.runtime.snapshots import SnapshotStore
from pandastack.host.runtime.table import SandboxTable
from pandastack.host.templates.builtin import TemplateStore
from pandastack.host.vmm.driver import SnapshotFiles, VMMDriver, VMPaths, VMProcess, VolumeDrive
from pandastack.host.volumes.attach import HostVolumes
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.results import SnapshotResult
from pandastack.hostport.volumes import VolumeMountRequest

Progress = Callable[[str], None]


class RuntimeParts(Protocol):
    config: HostConfig
    progress: Progress
    table: SandboxTable
    snapshots: SnapshotStore
    network: NetworkManager
    slots: SandboxSlots
    fork_buffer: ForkBuffer
    admission: MemoryAdmission
    merges: LayerMerges
    volumes: HostVolumes
    remote: RemoteState | None

    @property
    def driver(self) -> VMMDriver: ...

    @property
    def sandboxes_dir(self) -> Path: ...

    async def prepare(self) -> TemplateStore: ...

    async def restore_vm(self, paths: VMPaths, files: SnapshotFiles, disk: Path,
                         netns: str | None, volumes: dict[int, VolumeDrive]) -> VMProcess:
        """Restore a VM (its RAM from the hugetlb pool where it may: `vm_ended` frees it)."""
        ...

    def vm_ended(self, workdir: Path) -> None:
        """A sandbox's VMM process is gone: what it held on the host for its life is free."""
        ...

    def adopt(self, record: SandboxRecord, vm: VMProcess | None) -> SandboxHandle:
        """A handle for the record (already saved), in the table."""
        ...

    async def start_flatten(self, sandbox_id: str, vm: VMProcess) -> None: ...

    async def settle_flatten(self, sandbox_id: str, vm: VMProcess) -> None: ...

    async def create(self, template: str = ..., *, vcpus: int = ..., memory_mb: int = ...,
                     disk_mb: int | None = ..., sandbox_id: str | None = ...,
                     snapshot: str | None = ...,
                     network: NetworkPolicy | dict[str, Any] | None = ...,
                     volumes: Sequence[VolumeMountRequest] = ...,
                     forked_from: str | None = ...) -> SandboxHandle: ...

    async def snapshot(self, sandbox_id: str, name: str | None = ..., *,
                       internal: bool = ..., short_pause: bool | None = ...,
                       transient: bool = ...) -> SnapshotResult: ...

    async def kill(self, sandbox_id: str) -> None: ...

    async def wake(self, sandbox_id: str) -> None: ...

    def delete_snapshot(self, snapshot_id: str) -> None: ...

