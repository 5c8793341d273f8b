"""The API server's Prometheus metrics (`/metrics`, ADR 0026), in a registry of its own app
(several apps in one process, as tests make them, never share a series).

On the request path only counters and histograms move (no query, no lock): creates, forks
and wakes with their latencies (`timed`, on the service's methods), error responses by code
(`note_error`, where the envelope is made) and HostUnavailable from the host port
(`note_host_unavailable`, where it becomes an API error). What the store knows (sandboxes by
state, what they hold, the registry's hosts) is read once per scrape."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy import func, select
from starlette.types import ASGIApp, Receive, Scope, Send

from pandastack.wire.sandboxes import ENDED_STATES

from ..store import Sandbox, Store

P = ParamSpec("P")
R = TypeVar("R")

LIVE_STATES = ("starting", "running", "paused", "hibernated", "stopped", "host_lost")
OPERATIONS = ("create", "fork", "wake")
HOLDING_STATES = ("running", "paused")  # a VM holds its vCPUs and memory
# Under TCG a create is ~0.1-1 s, a fork of many or a cold wake seconds; a first template
# build minutes.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_current: contextvars.ContextVar[ServerMetrics | None] = contextvars.ContextVar(
    "pandastack_server_metrics", default=None)
_bound: weakref.WeakKeyDictionary[object, ServerMetrics] = weakref.WeakKeyDictionary()


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.operations = Counter(
            "pandastack_sandbox_operations", "creates, forks and wakes by outcome",
            ["operation", "outcome"], registry=r)
        self.latency = Histogram(
            "pandastack_sandbox_operation_seconds", "latency of creates, forks and wakes "
            "(as the API sees them, store work included)", ["operation"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.api_errors = Counter(
            "pandastack_api_errors", "error responses by HTTP status and error code",
            ["status", "code"], registry=r)
        self.host_unavailable = Counter(
            "pandastack_host_unavailable", "host port calls that failed with HostUnavailable "
            "(an agent out of reach, a registry not answering)", registry=r)
        self.sandboxes = Gauge("pandastack_sandboxes", "sandboxes that have not ended, by "
                               "state (from the store at scrape time)", ["state"], registry=r)
        self.held_vcpus = Gauge("pandastack_sandbox_vcpus", "vCPUs of running and paused "
                                "sandboxes", registry=r)
        self.held_memory = Gauge("pandastack_sandbox_memory_mb", "memory of running and "
                                 "paused sandboxes", registry=r)
        for operation in OPERATIONS:  # every series exists from the start (rate() needs it)
            self.latency.labels(operation)
            for outcome in ("ok", "error"):
                self.operations.labels(operation, outcome)
        labels = ["host"]
        self.host_vcpus = Gauge("pandastack_host_vcpus", "vCPUs a host offers", labels,
                                registry=r)
        self.host_memory = Gauge("pandastack_host_memory_mb", "memory a host offers", labels,
                                 registry=r)
        self.host_used_vcpus = Gauge("pandastack_host_used_vcpus", "vCPUs of a host's "
                                     "sandboxes with a VM", labels, registry=r)
        self.host_used_memory = Gauge("pandastack_host_used_memory_mb", "memory of a host's "
                                      "sandboxes with a VM", labels, registry=r)
        self.host_sandboxes = Gauge("pandastack_host_sandboxes", "a host's sandboxes "
                                    "(hibernated included), as it last reported", labels,
                                    registry=r)

    def bind(self, service: object) -> None:
        """Let `timed` methods of `service` report here."""
        _bound[service] = self

    def observe(self, operation: str, ok: bool, seconds: float) -> None:
        self.operations.labels(operation, "ok" if ok else "error").inc()
        self.latency.labels(operation).observe(seconds)

    # -- at scrape time ------------------------------------------------------------------

    async def refresh(self, store: Store | None, *, cluster: bool, local: bool) -> None:
        """Set the gauges from the store: one grouped query (the state index), and the
        registry's hosts in a cluster. `local`: the host runs in this process, so its
        capacity is this machine's."""
        if store is None:  # not started yet
            return
        rows, hosts = await asyncio.to_thread(_read, store, cluster)
        for state in LIVE_STATES:
            self.sandboxes.labels(state).set(0)
        vcpus = memory = 0
        for state, count, state_vcpus, state_memory in rows:
            self.sandboxes.labels(state).set(count)
            if state in HOLDING_STATES:
                vcpus += state_vcpus or 0
                memory += state_memory or 0
        self.held_vcpus.set(vcpus)
        self.held_memory.set(memory)
        for gauge in (self.host_vcpus, self.host_memory, self.host_used_vcpus,
                      self.host_used_memory, self.host_sandboxes):
            gauge.clear()
        if cluster:
            for h in hosts:
                self.host_vcpus.labels(h.id).set(h.vcpus)
                self.host_memory.labels(h.id).set(h.memory_mb)
                self.host_used_vcpus.labels(h.id).set(h.used_vcpus)
                self.host_used_memory.labels(h.id).set(h.used_memory_mb)
                self.host_sandboxes.labels(h.id).set(h.sandboxes)
        elif local:
            self.host_vcpus.labels("local").set(os.cpu_count() or 1)
            self.host_memory.labels("local").set(_mem_total_mb())
            self.host_used_vcpus.labels("local").set(vcpus)
            self.host_used_memory.labels("local").set(memory)
            self.host_sandboxes.labels("local").set(
                sum(count for state, count, _, _ in rows if state != "host_lost"))


def _read(store: Store, cluster: bool) -> tuple[list[tuple[str, int, int, int]], list[Any]]:
    with store.session() as s:
        rows = s.execute(
            select(Sandbox.state, func.count(), func.sum(Sandbox.vcpus),
                   func.sum(Sandbox.memory_mb))
            .where(Sandbox.state.notin_(ENDED_STATES)).group_by(Sandbox.state)).all()
    hosts = store.list_hosts() if cluster else []
    return [(str(a), int(b), int(c or 0), int(d or 0)) for a, b, c, d in rows], hosts


def _mem_total_mb() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


# -- hooks on the request path ------------------------------------------------------------

def timed(operation: str, when: Callable[..., bool] | None = None
          ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Count and time a service operation whose first argument is the service (a method's
    `self`, or `snapshots.fork`'s `service`). `when(*args, **kwargs)`: whether this call is
    one (a wake of a sandbox that is awake is a no-op, not a wake)."""
    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def timed_call(*args: P.args, **kwargs: P.kwargs) -> R:
            metrics = _bound.get(args[0]) if args else None
            if metrics is None or (when is not None and not when(*args, **kwargs)):
                return await fn(*args, **kwargs)
            started = time.perf_counter()
            ok = False
            try:
                result = await fn(*args, **kwargs)
                ok = True
                return result
            finally:
                metrics.observe(operation, ok, time.perf_counter() - started)
        return timed_call
    return wrap


def note_error(app: Any, status: int, code: str) -> None:
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    if isinstance(metrics, ServerMetrics):
        metrics.api_errors.labels(str(status), code).inc()


def note_host_unavailable() -> None:
    metrics = _current.get()
    if metrics is not None:
        metrics.host_unavailable.inc()


class MetricsContextMiddleware:
    """Makes the app's metrics the current ones while a request runs (for the hooks that
    see no request: where a host error becomes an API error)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _current.set(self.metrics)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
