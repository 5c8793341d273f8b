"""A sandbox's lifecycle settings (TTL, persistence) and its logs."""

from __future__ import annotations

from fastapi import APIRouter

from pandastack.hostport.errors import SandboxNotFound
from pandastack.wire.sandboxes import Lifecycle, Logs, SandboxState, UpdateLifecycle

from ..accounts.auth import CurrentPrincipal
from ..store import Sandbox
from ..web.jsonbody import StrictJsonRoute
from .deps import AppSettings, SandboxId, Service

router = APIRouter(tags=["lifecycle"], route_class=StrictJsonRoute)

AGENT_LINE_MARKERS = ("pandastack-agent", "pandastack-init")


def to_lifecycle(row: Sandbox, idle_timeout: int) -> Lifecycle:
    state: SandboxState = row.state  # type: ignore[assignment]
    return Lifecycle(ttl_seconds=row.ttl_seconds, persistent=row.persistent,
                     created_at=row.created_at,
                     expires_at=None if row.persistent else row.expires_at,
                     last_activity_at=row.last_activity_at,
                     idle_timeout_seconds=idle_timeout, state=state)


@router.get("/sandboxes/{sandbox_id}/lifecycle", response_model=Lifecycle)
async def get_lifecycle(sandbox_id: SandboxId, who: CurrentPrincipal, service: Service,
                        settings: AppSettings) -> Lifecycle:
    return to_lifecycle(service.row(who.team, sandbox_id), settings.idle_timeout_seconds)


@router.patch("/sandboxes/{sandbox_id}/lifecycle",
              operation_id="updateLifecycle", response_model=Lifecycle,
              summary="Change the TTL (expires_at = created_at + ttl_seconds), the timeout "
                      "(expires_at = now + timeout_seconds) or persistence",
              description="Setting `ttl_seconds` recomputes `expires_at = created_at + "
                          "ttl_seconds`: a larger value extends the life, a value already in "
                          "the past ends the sandbox on the next lifecycle sweep (~1 s). "
                          "`timeout_seconds` counts from now instead (E2B's set_timeout): "
                          "`expires_at = now + timeout_seconds`, stored as the TTL that ends "
                          "then (`ttl_seconds = ceil(now + timeout_seconds - created_at)`); "
                          "giving both is a 400. "
                          "`persistent=true` exempts it from both TTL and the idle reaper.")
async def patch_lifecycle(sandbox_id: SandboxId, body: UpdateLifecycle, who: CurrentPrincipal,
                          service: Service, settings: AppSettings) -> Lifecycle:
    row = service.set_lifecycle(who.team, sandbox_id, body.ttl_seconds, body.persistent,
                                body.timeout_seconds)
    return to_lifecycle(row, settings.idle_timeout_seconds)


@router.get("/sandboxes/{sandbox_id}/logs",
            operation_id="getSandboxLogs", response_model=Logs,
            summary="The tail of the VM console and the guest agent's lines in it")
async def get_logs(sandbox_id: SandboxId, who: CurrentPrincipal, service: Service,
                   settings: AppSettings) -> Logs:
    row = service.row(who.team, sandbox_id)
    try:
        data = await service.runtime.console_log(row.id, settings.logs_max_bytes)
    except SandboxNotFound:
        return Logs(console="", agent="")
    console = data.decode("utf-8", "replace")
    agent = "".join(line for line in console.splitlines(keepends=True)
                    if any(m in line for m in AGENT_LINE_MARKERS))
    return Logs(console=console, agent=agent)
