"""Where the time of create, exec, snapshot, fork and wake goes, read from their OpenTelemetry
spans (ADR 0049), and what tracing costs the server.

- **Breakdown**: a real `pandastack serve` (bench/api.py's `live_server`; with `--agent` it
  drives a `pandastack agent`, so the host API hop is in the trace) exporting its spans over
  OTLP to a receiver on loopback in this process (bench/otlp_receiver.py). This process
  traces too (OpenTelemetry's SDK as its global provider, exporting to the same receiver), so
  each SDK call is the root of a trace. N rounds of: create `base`, exec `true`, snapshot,
  fork (count 1; the child killed), hibernate, wake, kill. Printed: each call's tree of spans
  by name, the p50 of each and, beside it, its p50 share of its parent.
- **Cost** (`--cost M`, 0 skips it): the server's CPU time per request (utime + stime of its
  process from /proc) over M warm `exec true` calls on one sandbox of a server over the
  in-memory runtime of the tests (the API's path alone: a VMM and a guest would only add
  noise on a shared machine), with tracing off (no OTLP variable set) and on (batches at the
  exporter's default 5 s), three such pairs of servers one after the other; and the off path
  in this process: a `with tracing.span(...)` and a call through `tracing.traced`, in ns,
  against the bare block and the bare call (and a span of the API's no-op tracer).

Usage: python bench/phases.py [--n 10] [--agent] [--cost 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from api import live_agent, live_server
from common import pct
from otlp_receiver import ReceivedSpan, Receiver, children, receiving
from pandastack import Client, Sandbox, tracing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.server.live import fake_server

CLIENT = "bench-client"
CALLS = ("sandbox.create", "sandbox.exec", "sandbox.snapshot", "sandbox.fork",
         "sandbox.hibernate", "sandbox.wake")
MAX_DEPTH = 8


@contextmanager
def otlp_env(receiver: Receiver, batch_delay_ms: int | None = None) -> Iterator[None]:
    """The standard variables, naming `receiver`, for the processes started meanwhile
    (`batch_delay_ms`: how often their batches leave; None: the SDK's default, 5 s)."""
    names = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    if batch_delay_ms is not None:
        names["OTEL_BSP_SCHEDULE_DELAY"] = str(batch_delay_ms)
    os.environ.update(names)
    try:
        yield
    finally:
        for name in names:
            del os.environ[name]


def one_round(client: Client, api_url: str, api_key: str) -> None:
    sbx = Sandbox.create(template="base", api_url=api_url, api_key=api_key)
    try:
        assert sbx.exec("true").exit_code == 0
        snapshot = sbx.snapshot()
        for child in sbx.fork(count=1):
            child.kill()
        sbx.hibernate()
        sbx.wake()
        client.snapshots.delete(snapshot)
    finally:
        sbx.kill()


Paths = dict[tuple[str, ...], list[float]]


def _walk(spans: list[ReceivedSpan], span: ReceivedSpan, path: tuple[str, ...],
          root: ReceivedSpan, times: Paths, order: dict[tuple[str, ...], float]) -> None:
    times[path].append(span.ms)
    order.setdefault(path, (span.start_ns - root.start_ns) / 1e6)
    if len(path) < MAX_DEPTH:
        for child in children(spans, span):
            _walk(spans, child, (*path, child.name), root, times, order)


def breakdown(spans: list[ReceivedSpan]) -> None:
    """Per call: the tree of span names with p50s, merged over its traces (a name seen more
    than once a trace, such as fork's children, says how often)."""
    roots = [s for s in spans if s.service == CLIENT and s.name in CALLS and not s.parent_id]
    for call in CALLS:
        of_call = [r for r in roots if r.name == call]
        if not of_call:
            continue
        times: Paths = defaultdict(list)
        order: dict[tuple[str, ...], float] = {}
        for root in of_call:
            _walk(spans, root, (call,), root, times, order)
        print(f"\n{call} (n={len(of_call)}): p50 ms, share of its parent's p50")
        # Depth first, siblings in the order they started.
        for path in sorted(times, key=lambda p: [order[p[:i]] for i in range(1, len(p) + 1)]):
            mine = pct(times[path], 50)
            parent = pct(times[path[:-1]], 50) if len(path) > 1 else mine
            seen = len(times[path]) / len(of_call)
            label = "  " * (len(path) - 1) + path[-1] + (f" x{seen:.0f}" if seen > 1 else "")
            print(f"  {label:58s} {mine:8.1f}  {100 * mine / parent:5.0f} %")


def run_breakdown(n: int, agent: bool, receiver: Receiver) -> None:
    want = {"pandastack-api", "pandastack-agent"} if agent else {"pandastack-api"}

    def complete(rounds: int) -> Callable[[list[ReceivedSpan]], bool]:
        def test(spans: list[ReceivedSpan]) -> bool:
            """Each call's trace has its root and the spans of each server process."""
            roots = [s for s in spans if s.service == CLIENT and s.name in CALLS
                     and not s.parent_id]
            services: dict[str, set[str]] = defaultdict(set)
            for s in spans:
                services[s.trace_id].add(s.service)
            return len(roots) >= rounds * len(CALLS) and all(
                want <= services[r.trace_id] for r in roots)
        return test

    with tempfile.TemporaryDirectory(prefix="trace-", dir="/tmp") as tmp, \
            otlp_env(receiver, batch_delay_ms=100), agent_of(Path(tmp), agent) as drive, \
            live_server(Path(tmp), agent=drive) as server, \
            Client(server.api_url, server.api_key) as client:
        one_round(client, server.api_url, server.api_key)  # warm-up: pools, template
        receiver.wait_for(complete(1), 60)
        receiver.clear()
        for _ in range(n):
            one_round(client, server.api_url, server.api_key)
        spans = receiver.wait_for(complete(n), 60)
    breakdown(spans)


@contextmanager
def agent_of(tmp: Path, agent: bool) -> Iterator[tuple[str, Path] | None]:
    if not agent:
        yield None
        return
    (tmp / "agent").mkdir()
    with live_agent(tmp / "agent") as client:
        yield client.address, tmp / "agent" / "agent.token"


def cpu_s(pid: int) -> float:
    """utime + stime of process `pid` (all its threads: the exporter's too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_exec(m: int) -> float:
    """The server's CPU ms per warm exec: tests/server/serve_fake.py (`serve_app`, so it
    traces as `pandastack serve` does) over the in-memory runtime, so that what is counted
    is the API's own path and tracing's share of it, not a VMM's or a guest's."""
    with tempfile.TemporaryDirectory(prefix="trace-cost-", dir="/tmp") as tmp, \
            fake_server(Path(tmp)) as server:
        sbx = Sandbox.create(template="base", api_url=server.url, api_key=server.admin_key)
        try:
            for _ in range(20):
                sbx.exec("true")
            before = cpu_s(server.pid)
            for _ in range(m):
                sbx.exec("true")
            return (cpu_s(server.pid) - before) / m * 1000
        finally:
            sbx.kill()


def off_path_ns(rounds: int = 200_000) -> tuple[float, float, float, float, float]:
    """(bare block, `with span`, bare await, await through `traced`, a span of the API's
    no-op tracer), ns each, tracing off."""
    assert not tracing.enabled()
    noop = trace.NoOpTracer()

    async def bare() -> None:
        return None

    wrapped = tracing.traced("x")(bare)

    def timed_with(kind: str) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            if kind == "ours":
                with tracing.span("x"):
                    pass
            elif kind == "noop":
                with noop.start_as_current_span("x"):
                    pass
        return (time.perf_counter_ns() - t0) / rounds

    async def timed_call(fn: Callable[[], Awaitable[None]]) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            await fn()
        return (time.perf_counter_ns() - t0) / rounds

    loop = asyncio.new_event_loop()
    try:
        return (timed_with("bare"), timed_with("ours"),
                loop.run_until_complete(timed_call(bare)),
                loop.run_until_complete(timed_call(wrapped)), timed_with("noop"))
    finally:
        loop.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--agent", action="store_true")
    parser.add_argument("--cost", type=int, default=300, metavar="M")
    args = parser.parse_args()
    with receiving() as receiver:
        provider = TracerProvider(resource=Resource.create({"service.name": CLIENT}))
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces")))
        trace.set_tracer_provider(provider)
        if args.n:
            run_breakdown(args.n, args.agent, receiver)
        if args.cost:
            print(f"\nserver CPU per warm exec, in-memory runtime (n={args.cost} each; pairs "
                  "of servers, off then on, the exporter at its default 5 s batches):")
            for _ in range(3):
                off = cpu_per_exec(args.cost)
                with otlp_env(receiver):
                    on = cpu_per_exec(args.cost)
                print(f"  tracing off {off:.2f} ms, on {on:.2f} ms ({on - off:+.2f} ms)")
    block, with_span, call, traced_call, noop = off_path_ns()
    print(f"off path in this process: `with tracing.span()` {with_span - block:.0f} ns over "
          f"the bare block (the API's no-op tracer's span: {noop - block:.0f} ns); a "
          f"`traced` call {traced_call - call:.0f} ns over the bare call ({call:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
