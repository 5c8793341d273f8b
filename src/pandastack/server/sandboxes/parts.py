"""What the sandbox service's parts (`names.py`, `stopped.py`) use of the service, as a
protocol: they take the service as this, so they need not import `service.py`, which imports
them to build itself (an import contract keeps that circle broken)."""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from pandastack.hostport.protocols import RuntimePort, SandboxPlacement
    from pandastack.wire.sandboxes import CreateSandbox

    from ..accounts.quotas import Quotas
    from ..hosts.cluster import ClusterPool
    from ..settings import Settings
    from ..store import Sandbox, Store

#: Longer than a create may take (the host client's lifecycle timeout is 900 s).
CREATE_DEADLINE_SECONDS = 1800.0

T = TypeVar("T")


class ServiceParts(Protocol):
    @property
    def store(self) -> Store: ...
    @property
    def runtime(self) -> RuntimePort: ...
    @property
    def quotas(self) -> Quotas: ...
    @property
    def cluster(self) -> ClusterPool | None: ...
    @property
    def settings(self) -> Settings: ...
    # What the reconcile at start left running without a row (stopped.reconcile).
    unknown_vms: list[str]

    # Awaitable, not async: the service's are wrapped by telemetry's `timed`.
    def create(self, team: str, req: CreateSandbox) -> Awaitable[Sandbox]: ...
    def wake_row(self, row: Sandbox) -> Awaitable[Sandbox]: ...
    async def sync_state(self, row: Sandbox) -> Sandbox: ...
    def stop_row(self, row: Sandbox, reason: str) -> Sandbox: ...
    def transition(self, sandbox_id: str) -> AbstractAsyncContextManager[None]: ...
    async def host_call(self, op: Awaitable[T]) -> T: ...
    async def placement(self, sandbox_id: str) -> SandboxPlacement: ...
    def host_of(self, sandbox_id: str) -> str | None: ...
    def mark_lost_hosts(self) -> list[str]: ...
