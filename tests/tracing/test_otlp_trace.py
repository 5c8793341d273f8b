"""A create and an exec through the SDK, from a program that traces, are one trace: the
program's span, the SDK's, the API server's, the agent's (a second process, reached over the
host API) and the host runtime's phases, exported over OTLP by each process to a real
receiver on loopback (bench/otlp_receiver.py). The runtime has the fake VMM driver (no root,
no VM); the QEMU driver's own phases are seen in bench/phases.py's run."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import vmm_pids_under
from tests.host import fake_vmm  # noqa: F401  (vmm_pids_under knows its VMMs once imported)
from tests.server.live import fake_server, terminate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import otlp_receiver  # noqa: E402  (bench/ is not a package)
from otlp_receiver import ReceivedSpan, Receiver  # noqa: E402

# e2e: three processes over HTTP, ~20 s; the lanes start such modules first.
pytestmark = [pytest.mark.timeout(180), pytest.mark.e2e]

AGENT_START_S = 60.0
CREATE = ["program", "sandbox.create", "POST /v1/sandboxes", "createSandbox", "host.create",
          "runtime.create"]
EXEC = ["program", "sandbox.exec", "POST /v1/sandboxes/{sandbox_id}/exec", "execCommand",
        "guest.exec"]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """The receiver, named by the standard variables the processes started here inherit."""
    with otlp_receiver.receiving() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: the batch goes out soon
        for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME",
                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            monkeypatch.delenv(name, raising=False)
        yield r


@pytest.fixture
def agent(receiver: Receiver) -> Iterator[Path]:
    """tests/tracing/fake_agent.py running in a directory of its own; its VMMs killed and
    the directory removed at the end."""
    tmp = Path(tempfile.mkdtemp(prefix="trc-", dir="/tmp"))  # short: a unix socket's path
    with (tmp / "agent.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.tracing.fake_agent", str(tmp)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        transport = httpx.HTTPTransport(uds=str(tmp / "agent.sock"))
        deadline = time.monotonic() + AGENT_START_S
        with httpx.Client(transport=transport, base_url="http://agent", timeout=2) as http:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if http.get("/health").status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the fake agent did not come up:\n"
                                         + (tmp / "agent.log").read_text()[-3000:])
                time.sleep(0.05)
        yield tmp
    finally:
        terminate(proc, 10)
        for pid in vmm_pids_under(tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def lineage(spans: list[ReceivedSpan], leaf: ReceivedSpan) -> list[ReceivedSpan]:
    """`leaf` and its ancestors, the root first."""
    by_id = {s.span_id: s for s in spans}
    chain = [leaf]
    while chain[0].parent_id:
        chain.insert(0, by_id[chain[0].parent_id])  # KeyError: a parent never received
    return chain


def test_create_and_exec_through_the_sdk_are_one_trace(receiver: Receiver, agent: Path,
                                                       tmp_path: Path) -> None:
    with fake_server(tmp_path, module="tests.tracing.serve_traced",
                     agent=f"unix:{agent / 'agent.sock'}",
                     agent_token_file=str(agent / "agent.token")) as server:
        done = subprocess.run(
            [sys.executable, "-m", "tests.tracing.traced_client", server.url,
             server.admin_key], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:] + server.log_tail()
        trace_id = done.stdout.split()[-1]
        wanted = {"guest.handshake", "guest.exec", "execCommand", CREATE[2]}

        def complete(spans: list[ReceivedSpan]) -> bool:
            return wanted <= {s.name for s in spans if s.trace_id == trace_id}

        spans = [s for s in receiver.wait_for(complete, 60) if s.trace_id == trace_id]
    handshake = next(s for s in spans if s.name == "guest.handshake")
    chain = lineage(spans, handshake)
    assert [s.name for s in chain] == [*CREATE, "guest.handshake"], chain
    assert [s.service for s in chain[:4]] == ["traced-client", "traced-client",
                                              "pandastack-api", "pandastack-agent"]
    assert {s.service for s in chain[3:]} == {"pandastack-agent"}
    runtime_create = chain[-2]
    phases = [s.name for s in otlp_receiver.children(spans, runtime_create)]
    assert phases == ["runtime.network_slot", "runtime.overlay", "vmm.restore",
                      "guest.handshake"], phases
    # Each phase within its parent's time; each hop to another process begins while its
    # caller waits (a server's span ends once its answer is sent, which its caller may have
    # read a few ms before: ci2 saw the API's span end 2.7 ms after the client's).
    for parent, child in itertools.pairwise(chain):
        assert parent.start_ns <= child.start_ns <= parent.end_ns, (parent, child)
        if child.service == parent.service:
            assert child.end_ns <= parent.end_ns, (parent, child)
    exec_span = next(s for s in spans if s.name == "guest.exec")
    assert [s.name for s in lineage(spans, exec_span)] == EXEC
    api = chain[2]
    assert api.attributes["http.route"] == "/v1/sandboxes"
    assert api.attributes["http.response.status_code"] == 201
