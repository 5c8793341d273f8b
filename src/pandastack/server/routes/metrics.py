"""A sandbox's metrics: CPU, memory and root-disk use, measured in its guest as the request
asks (ADR 0026). Reading them is observation, not use: it neither wakes a hibernated sandbox
(409: waking would cost a restore and restart its metered time) nor counts as activity for
the idle timeout."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from pandastack.guestproto.ops import (
    METRICS_MAX_WINDOW_MS,
    METRICS_MIN_WINDOW_MS,
    METRICS_WINDOW_MS,
)
from pandastack.hostport.errors import SandboxNotFound
from pandastack.wire.sandboxes import SandboxMetrics

from ..accounts.auth import CurrentPrincipal
from ..sandboxes.wire_forms import lost
from ..web.errors import conflict
from ..web.jsonbody import StrictJsonRoute
from .deps import SandboxId, Service

router = APIRouter(tags=["sandboxes"], route_class=StrictJsonRoute)

WindowMs = Annotated[int, Query(ge=METRICS_MIN_WINDOW_MS, le=METRICS_MAX_WINDOW_MS,
                                description="how long to measure CPU use, ms")]


@router.get("/sandboxes/{sandbox_id}/metrics", response_model=SandboxMetrics,
            summary="CPU, memory and disk use, measured in the guest now",
            description="CPU use is the non-idle share of all the guest's CPUs over "
                        "`window_ms` (the answer takes that long); memory used is MemTotal "
                        "- MemAvailable; disk is the root file system. Nothing is sampled "
                        "between requests. A paused or hibernated sandbox gets 409 (it is "
                        "not woken), and a read does not count as activity.")
async def get_sandbox_metrics(sandbox_id: SandboxId, who: CurrentPrincipal, service: Service,
                              window_ms: WindowMs = METRICS_WINDOW_MS) -> SandboxMetrics:
    row = service.row(who.team, sandbox_id, touch=False)
    if row.state == "host_lost":
        raise lost(row)
    if row.state != "running":
        raise conflict(f"sandbox {sandbox_id} is {row.state}, not running")
    try:
        handle = service.runtime.handle(row.id)
    except SandboxNotFound:
        raise conflict(f"sandbox {sandbox_id} is not running on this host") from None
    m = await handle.metrics(window_ms)
    return SandboxMetrics(cpu_percent=m.cpu_percent, cpu_count=m.cpu_count,
                          memory_used_bytes=m.memory_used_bytes,
                          memory_total_bytes=m.memory_total_bytes,
                          disk_used_bytes=m.disk_used_bytes,
                          disk_total_bytes=m.disk_total_bytes, window_ms=m.window_ms,
                          sampled_at=time.time())
