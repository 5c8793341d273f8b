"""The route of a sandbox's metrics: what its guest measures when asked (CPU over a short
window the request opens, memory, root disk)."""

from __future__ import annotations

from fastapi import APIRouter, Query

from pandastack.hostport.wire import GuestMetricsModel

from .deps import Sandbox

router = APIRouter(prefix="/sandboxes/{sandbox_id}", tags=["sandboxes"])


@router.get("/metrics", operation_id="getSandboxMetrics")
async def get_sandbox_metrics(sandbox: Sandbox,
                              window_ms: int = Query(200, ge=10, le=2000)) -> GuestMetricsModel:
    return GuestMetricsModel.of(await sandbox.metrics(window_ms))
