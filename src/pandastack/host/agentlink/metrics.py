"""`metrics` of `AgentClient`: the guest's CPU, memory and root-disk use, which the guest
samples when asked (spec/guest-protocol.md "metrics")."""

from __future__ import annotations

from pandastack.host.agentlink.channel import AgentChannel
from pandastack.hostport.results import GuestMetrics

DEFAULT_WINDOW_MS = 200
MAX_WINDOW_MS = 2000
"""The guest clamps the window to 10..2000 ms; the host asks for no more."""

class MetricsOps(AgentChannel):
    async def metrics(self, window_ms: int = DEFAULT_WINDOW_MS) -> GuestMetrics:
        window_ms = max(10, min(int(window_ms), MAX_WINDOW_MS))
        f = await self._call("metrics", expect="metrics", window_ms=window_ms)
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
