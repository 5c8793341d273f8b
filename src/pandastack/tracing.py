"""OpenTelemetry spans of the API server and the host agent (ADR 0049).

Off unless an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, the standard variables; `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` keep it off): `pandastack serve` and `pandastack agent` call
`configure_from_env` once. While off, `span` hands back one shared no-op context and `traced`
calls straight through: no span object, no context change, no OpenTelemetry import on the
request path (measured in the ADR).

This module keeps its own tracer rather than setting OpenTelemetry's global provider: a
process that embeds the server (tests, benchmarks) keeps its own global one for itself.
Context crosses HTTP hops as W3C `traceparent` (`headers`, `TracingMiddleware`), whatever
propagators the global API is set to.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping, MutableMapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("pandastack.tracing")

P = ParamSpec("P")
R = TypeVar("R")
AttributeValue = str | bool | int | float

# nullcontext keeps no state: one instance serves every `with` at once.
_OFF: AbstractContextManager[None] = contextlib.nullcontext()
_tracer: Tracer | None = None
_w3c: TraceContextTextMapPropagator | None = None
SERVER_SERVICE = "pandastack-api"
AGENT_SERVICE = "pandastack-agent"


def enabled() -> bool:
    return _tracer is not None


def use(provider: TracerProvider | None) -> None:
    """Spans from now on go to `provider` (None: off). `configure_from_env` calls it; tests
    and benchmarks give an SDK provider of their own (an in-memory exporter's)."""
    global _tracer, _w3c
    if provider is None:
        _tracer = None
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    _w3c = TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("pandastack")


def endpoint_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for OTLP export of traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def configure_from_env(service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Export spans over OTLP (HTTP/protobuf, batched off the request path) when the
    environment names an endpoint; the exporter itself reads the other standard variables
    (headers, timeout, compression), the provider the sampler's. True when on."""
    if _tracer is not None:
        return True
    if not endpoint_configured(environ):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning("an OTLP endpoint is set but the OpenTelemetry SDK or its OTLP exporter "
                    "is missing (%s; pip install 'pandastack[server]'): no spans", exc)
        return False
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol.strip().lower() != "http/protobuf":
        log.warning("OTLP protocol %r is not installed here: spans go as http/protobuf",
                    protocol)
    # OTEL_SERVICE_NAME, where set, names the process; the SDK reads it itself.
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = SdkTracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use(provider)
    log.info("tracing: spans of %s exported over OTLP", service)
    return True


def span(name: str, attributes: Mapping[str, AttributeValue] | None = None
         ) -> AbstractContextManager[object]:
    """A child span of the current one around a `with` block (the shared no-op while off)."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    return tracer.start_as_current_span(name, attributes=attributes)


def traced(name: str) -> Callable[[Callable[P, Coroutine[Any, Any, R]]],
                                  Callable[P, Coroutine[Any, Any, R]]]:
    """A coroutine function whose every call is a span `name` (a direct call while off)."""
    def decorate(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            tracer = _tracer
            if tracer is None:
                return await fn(*args, **kwargs)
            with tracer.start_as_current_span(name):
                return await fn(*args, **kwargs)
        return call
    return decorate


def annotate(key: str, value: AttributeValue) -> None:
    """Set an attribute on the current span (nothing while off)."""
    if _tracer is not None:
        from opentelemetry import trace
        trace.get_current_span().set_attribute(key, value)


def headers() -> dict[str, str] | None:
    """`traceparent` (and `tracestate`) of the current span for an outgoing request; None
    while off or outside any span."""
    if _tracer is None or _w3c is None:
        return None
    carrier: dict[str, str] = {}
    _w3c.inject(carrier)
    return carrier or None


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_CARRIED = (b"traceparent", b"tracestate")
# Probes, polled every few seconds by load balancers, heartbeats and Prometheus: no traces.
UNTRACED_PATHS = frozenset({"/health", "/metrics"})


def route_template(path: str, route_path: str) -> str:
    """The full template of a request's route: the router matched `route_path` relative to
    the prefix its router was included under (FastAPI's included routers keep their own
    paths), which is the request path's leading segments."""
    parts = path.split("/")
    keep = len(parts) - route_path.count("/")
    return "/".join(parts[:keep]) + route_path if keep >= 1 else route_path


class TracingMiddleware:
    """A SERVER span for each HTTP request, the child of the caller's `traceparent`, named
    once the router has matched: the route's operationId (`by_operation`, the host API's)
    or "METHOD /route/{template}" (the REST API's). Its status is the response's."""

    def __init__(self, app: ASGIApp, *, by_operation: bool = False) -> None:
        self.app = app
        self.by_operation = by_operation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracer = _tracer
        if (tracer is None or scope["type"] != "http" or _w3c is None
                or scope.get("path") in UNTRACED_PATHS):
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode
        carrier = {k.decode("latin-1"): v.decode("latin-1")
                   for k, v in scope.get("headers", ()) if k in _CARRIED}
        parent = _w3c.extract(carrier) if carrier else None
        method = scope.get("method", "GET")
        status = 0

        async def send_noting_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with tracer.start_as_current_span(
                method, context=parent, kind=SpanKind.SERVER,
                attributes={"http.request.method": method,
                            "url.path": scope.get("path", "")}) as current:
            try:
                await self.app(scope, receive, send_noting_status)
            finally:
                route = scope.get("route")
                template = getattr(route, "path", None)
                if template:
                    template = route_template(scope.get("path", ""), template)
                operation = getattr(route, "operation_id", None) if self.by_operation else None
                if operation:
                    current.update_name(operation)
                elif template:
                    current.update_name(f"{method} {template}")
                if template:
                    current.set_attribute("http.route", template)
                if status:
                    current.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        current.set_status(Status(StatusCode.ERROR))
