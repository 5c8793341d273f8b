"""Tracing while no endpoint is configured: nothing made per call; the SDK never imports
OpenTelemetry itself, and carries the caller's context where the program has one."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from pandastack import tracing
from pandastack.sdk import Client

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331


def test_off_unless_an_endpoint_is_configured() -> None:
    assert not tracing.endpoint_configured({})
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.endpoint_configured(on)
    assert tracing.endpoint_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x"})
    assert not tracing.endpoint_configured({**on, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.endpoint_configured({**on, "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.configure_from_env("test", {})
    assert not tracing.enabled()


async def test_off_spans_are_one_shared_no_op() -> None:
    assert not tracing.enabled()
    assert tracing.span("a") is tracing.span("b", {"k": 1})
    assert tracing.headers() is None

    @tracing.traced("c")
    async def double(x: int) -> int:
        return 2 * x

    assert await double(21) == 42
    tracing.annotate("k", "v")  # nothing to annotate, and no error


def test_the_sdk_does_not_import_opentelemetry() -> None:
    script = ("import sys\nfrom pandastack import Sandbox, Client\n"
              "import pandastack.sdk._http\n"
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    assert json.loads(done.stdout.replace("'", '"')) == []


def test_the_sdk_carries_the_callers_context_without_a_provider() -> None:
    """A program that only has the API (no provider: no span of ours) still passes on the
    context it continues, as W3C traceparent."""
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={"sandboxes": [], "next_cursor": None})

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), (
        "a test set the global provider")
    parent = SpanContext(TRACE_ID, SPAN_ID, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    client = Client(api_url="http://api.test", api_key="k",
                    transport=httpx.MockTransport(answer))
    try:
        client.sandboxes.list()
        with trace.use_span(NonRecordingSpan(parent)):
            client.sandboxes.list()
    finally:
        client.close()
    assert "traceparent" not in seen[0]
    assert seen[1]["traceparent"] == f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


@pytest.fixture(autouse=True)
def tracing_stays_off() -> None:
    tracing.use(None)


def test_route_templates_keep_the_prefix_their_router_was_included_under() -> None:
    assert tracing.route_template("/v1/sandboxes/sbx-1/exec",
                                  "/sandboxes/{sandbox_id}/exec") == (
        "/v1/sandboxes/{sandbox_id}/exec")
    assert tracing.route_template("/v1/sandboxes", "/sandboxes") == "/v1/sandboxes"
    assert tracing.route_template("/health", "/health") == "/health"
