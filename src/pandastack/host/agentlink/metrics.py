"""`metrics` of `AgentClient`: the guest's CPU, memory and root-disk use, which the guest
samples when asked (spec/guest-protocol.md "metrics")."""

from __future__ import annotations

from pandastack.guestproto.ops import (
    METRICS_MAX_WINDOW_MS,
    METRICS_MIN_WINDOW_MS,
    METRICS_WINDOW_MS,
)
from pandastack.host.agentlink.channel import AgentChannel
from pandastack.hostport.results import GuestMetrics


class MetricsOps(AgentChannel):
    async def metrics(self, window_ms: int = METRICS_WINDOW_MS) -> GuestMetrics:
        # The guest refuses a window below the minimum and clamps one above the maximum: the
        # host asks for neither.
        window_ms = max(METRICS_MIN_WINDOW_MS, min(int(window_ms), METRICS_MAX_WINDOW_MS))
        f = await self._call("metrics", window_ms=window_ms)
        number = (int, float)
        return GuestMetrics(
            cpu_percent=float(self._field(f, "cpu_percent", number)),
            cpu_count=self._field(f, "cpu_count", int),
            memory_used_bytes=self._field(f, "memory_used_bytes", int),
            memory_total_bytes=self._field(f, "memory_total_bytes", int),
            disk_used_bytes=self._field(f, "disk_used_bytes", int),
            disk_total_bytes=self._field(f, "disk_total_bytes", int),
            window_ms=self._field(f, "window_ms", int),
        )
