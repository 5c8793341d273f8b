"""The SDK's side of tracing (ADR 0049): a CLIENT span for each call, its context sent to the
server as W3C `traceparent`, when the program using the SDK traces with OpenTelemetry.

The SDK does not depend on OpenTelemetry and never imports it: a program that traces has
imported `opentelemetry.trace` already, and one that has not can have no span to continue.
So each call first looks in `sys.modules` (~0.1 µs); without a configured tracer provider
(the API's default proxy) there is no span of ours either, only the caller's context (if
any) carried on.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

_NAME = "pandastack.sdk"


@contextmanager
def _client_span(trace: Any, name: str, method: str, path: str
                 ) -> Iterator[dict[str, str]]:
    from opentelemetry import propagate
    carrier: dict[str, str] = {}
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        propagate.inject(carrier)
        yield carrier
        return
    tracer = provider.get_tracer(_NAME)
    with tracer.start_as_current_span(
            name, kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": method, "url.path": path}):
        propagate.inject(carrier)
        yield carrier


@contextmanager
def traced_call(name: str | None, method: str, path: str,
                headers: Mapping[str, str] | None) -> Iterator[Mapping[str, str] | None]:
    """Around one request: yields the headers to send (`headers` plus `traceparent` where
    there is a context to carry). `name`: the span's (default "METHOD")."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        yield headers
        return
    with _client_span(trace, name or method, method, path) as carrier:
        yield {**headers, **carrier} if headers and carrier else (carrier or headers)
