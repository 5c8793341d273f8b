"""The wire forms of what the sandbox service holds (a row as `SandboxInfo`, a host's network
policy as `NetworkSpec`), and the answer for a sandbox whose host was lost."""

from __future__ import annotations

from collections.abc import Sequence

from pandastack.hostport.network import NetworkPolicy
from pandastack.wire.sandboxes import AttachedVolume, NetworkSpec, SandboxInfo, SandboxState

from ..store import Sandbox
from ..web.errors import ApiError


def to_info(row: Sandbox, volumes: Sequence[AttachedVolume] = ()) -> SandboxInfo:
    state: SandboxState = row.state  # type: ignore[assignment]
    return SandboxInfo(
        id=row.id, template=row.template, state=state, created_at=row.created_at,
        expires_at=None if row.persistent else row.expires_at, ttl_seconds=row.ttl_seconds,
        persistent=row.persistent, vcpus=row.vcpus, memory_mb=row.memory_mb,
        disk_mb=row.disk_mb, metadata=dict(row.meta or {}), ended_at=row.ended_at,
        end_reason=row.end_reason, snapshot=row.snapshot, host_id=row.host_id,
        volumes=list(volumes), name=row.name, stop_reason=row.stop_reason,
        restored_from=row.restored_from,  # type: ignore[arg-type]
    )


def lost(row: Sandbox, why: str = "") -> ApiError:
    return ApiError(409, "host_lost", f"sandbox {row.id} was on host {row.host_id}, which "
                    "stopped heartbeating: its VM is gone" + (f"; {why}" if why else
                    " (wake it to restore the state it last saved, if it saved one)"))


def to_network_spec(policy: NetworkPolicy | None) -> NetworkSpec:
    """The wire form of a host's policy (the default policy when there is none)."""
    return NetworkSpec() if policy is None else NetworkSpec.model_validate(policy.to_dict())
