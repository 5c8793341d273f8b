"""`python -m tests.tracing.traced_client URL KEY`: a program that traces with OpenTelemetry
(its SDK as the global provider, exporting over OTLP where the standard variables say) and
uses our SDK: create, exec `true`, kill, under one span "program". Prints the trace's id."""

from __future__ import annotations

import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from pandastack import Sandbox

SERVICE = "traced-client"


def main(argv: list[str]) -> int:
    url, key = argv
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    with trace.get_tracer("traced-client").start_as_current_span("program") as root:
        sbx = Sandbox.create(template="base", api_url=url, api_key=key)
        result = sbx.exec("true")
        sbx.kill()
    provider.shutdown()
    assert result.exit_code == 0, result
    print(format(root.get_span_context().trace_id, "032x"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
