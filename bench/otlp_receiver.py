"""A loopback OTLP/HTTP trace receiver: what an OpenTelemetry collector would be told, kept in
memory. bench/phases.py prints its spans' breakdown; tests/tracing checks the trees.

`POST /v1/traces` bodies (protobuf `ExportTraceServiceRequest`, gzip or not) are decoded with
the opentelemetry-proto package (the OTLP exporter's own dependency) into `ReceivedSpan`s.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    end_ns: int
    kind: int
    attributes: dict[str, object] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value: AnyValue) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = next((str(_value(a.value)) for a in resource_spans.resource.attributes
                        if a.key == "service.name"), "")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=service, name=s.name, trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(),
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    kind=s.kind, attributes={a.key: _value(a.value) for a in s.attributes}))
    return spans


class Receiver:
    """The spans received so far (`spans()`), and a condition to wait on for more."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self.changed = threading.Condition()
        self.url = ""

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self.changed:
            self._spans.extend(spans)
            self.changed.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        with self.changed:
            return list(self._spans)

    def clear(self) -> None:
        with self.changed:
            self._spans.clear()

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool],
                 timeout: float) -> list[ReceivedSpan]:
        """The spans once `done(spans)` holds (woken by each export), or AssertionError."""
        with self.changed:
            if not self.changed.wait_for(lambda: done(self._spans), timeout):
                names = sorted({s.name for s in self._spans})
                raise AssertionError(f"spans not received in {timeout} s; have {names}")
            return list(self._spans)


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != PATH:
                self.send_error(404)
                return
            receiver.add(decode(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port); its `url` is the OTLP endpoint to configure
    (OTEL_EXPORTER_OTLP_ENDPOINT: exporters add /v1/traces)."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id and
                   s.trace_id == parent.trace_id), key=lambda s: s.start_ns)


def render(spans: list[ReceivedSpan], root: ReceivedSpan, depth: int = 0) -> Iterator[str]:
    """The tree under `root`, one indented line per span with its duration."""
    yield f"{'  ' * depth}{root.name} [{root.service}] {root.ms:.1f} ms"
    for child in children(spans, root):
        yield from render(spans, child, depth + 1)
