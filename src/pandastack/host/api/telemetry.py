"""The agent's Prometheus metrics (`/metrics`, ADR 0026), in a registry of its own app.

On the request path one histogram observation per host API call (its operationId; a stream
counts until its last frame). At scrape time: the host's sandboxes by state (the runtime's
list, in memory), the guest channel failures of this process, and the machine's capacity:
its memory, what admission keeps in reserve and holds for VM starts (ADR 0050)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from pandastack.host.agentlink.failures import CHANNEL_FAILURES
from pandastack.host.memory.admission import MIB, MemoryAdmission, meminfo_kib
from pandastack.hostport.protocols import RuntimePort

STATES = ("running", "paused", "hibernated")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)
FAILURE_KINDS = ("timeout", "closed", "protocol", "reconnect")


class _ChannelFailures(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "pandastack_agent_guest_channel_failures", "guest agent channel failures by "
            "kind (timeout, closed, protocol, reconnect)", labels=["kind"])
        for kind in sorted(set(FAILURE_KINDS) | set(CHANNEL_FAILURES)):
            family.add_metric([kind], CHANNEL_FAILURES[kind])
        yield family


class AgentMetrics:
    def __init__(self, admission: MemoryAdmission | None = None) -> None:
        self.admission = admission
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.latency = Histogram("pandastack_agent_operation_seconds", "host API calls by "
                                 "operation (streams: until their last frame)",
                                 ["operation"], buckets=LATENCY_BUCKETS, registry=r)
        self.sandboxes = Gauge("pandastack_agent_sandboxes", "this host's sandboxes by "
                               "state (running and paused ones have a VM)", ["state"],
                               registry=r)
        self.cpus = Gauge("pandastack_agent_cpus", "CPUs of this machine", registry=r)
        self.memory_total = Gauge("pandastack_agent_memory_total_bytes", "memory of this "
                                  "machine", registry=r)
        self.memory_available = Gauge("pandastack_agent_memory_available_bytes", "memory "
                                      "this machine can still hand out (MemAvailable)",
                                      registry=r)
        self.memory_reserve = Gauge("pandastack_agent_memory_reserve_bytes", "memory that VM "
                                    "starts must leave available (PANDASTACK_MEMORY_RESERVE_MB)",
                                    registry=r)
        self.memory_reserved = Gauge("pandastack_agent_memory_reserved_bytes", "memory "
                                     "reserved for VM starts under way and new VMs' first "
                                     "commands, not in MemAvailable yet", registry=r)
        r.register(_ChannelFailures())

    async def refresh(self, host: RuntimePort) -> None:
        counts = dict.fromkeys(STATES, 0)
        for sandbox in await host.list_sandboxes():
            counts[sandbox.state] = counts.get(sandbox.state, 0) + 1
        for state, count in counts.items():
            self.sandboxes.labels(state).set(count)
        self.cpus.set(os.cpu_count() or 1)
        total, available = meminfo_kib() or (0, 0)
        self.memory_total.set(total * 1024)
        self.memory_available.set(available * 1024)
        status = self.admission.status() if self.admission is not None else None
        if status is not None:
            self.memory_reserve.set(status.reserve_mb * MIB)
            self.memory_reserved.set(status.held_mb * MIB)


class LatencyMiddleware:
    """Times each call that matched a route, by that route's operationId (read from the
    scope once the router has set it: no matching of our own)."""

    def __init__(self, app: ASGIApp, metrics: AgentMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            operation = getattr(scope.get("route"), "operation_id", None)
            if operation is not None:
                self.metrics.latency.labels(operation).observe(time.perf_counter() - started)
