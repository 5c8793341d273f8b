"""E2B's SDKs at the versions other than the newest Python one, unchanged, against a live
server booting real VMs: Python e2b 2.45.1 (before `/v2`) with e2b-code-interpreter 2.10.0,
sync and async, and JavaScript e2b 2.51.0 with @e2b/code-interpreter 2.8.0 (node).

Each client script (tests/e2e/e2b_clients/) runs the same steps in one sandbox of the code
interpreter's template and writes one outcome a step; a test here is one (client, step), so
what a client cannot do yet fails alone. The SDKs come from scripts/e2b-sdks.sh (PyPI and
npm, pinned, cached under $PANDASTACK_HOME/cache/e2b-sdks): a targeted run needs no other step.
The clients see only what a user sets: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack import Client
from pandastack.server.compat.e2b.rest.base import e2b_key
from pandastack.wire.sandboxes import ENDED_STATES
from tests.e2e.conftest import LiveServer
from tests.leftovers import owned_tmpdir

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
CLIENTS_DIR = Path(__file__).with_name("e2b_clients")
STEPS = ("create", "agent_loop", "commands", "background", "files", "stdin_reconnect", "watch",
         "pty", "run_code", "png", "fork", "list_metadata", "timeout", "pause_resume", "kill",
         "gone")
CLIENTS = ("py-sync", "py-async", "js")
# `make test` runs py-sync and js; py-async is marked `soak` (`make soak` runs it): it is
# py-sync's steps through the same SDK's AsyncSandbox, the same requests on the wire, so what
# it adds is a check of E2B's async client rather than of this server (~46 s of the lane on
# a quiet machine, a third of the module).
MAKE_SOAK_CLIENTS = ("py-async",)
CLIENT_TIMEOUT = 900  # a bound on a hung SDK call, never a pass/fail criterion

# (client, step) -> why it is expected to fail today; strict, so a fix shows up as XPASS.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}


def marks(client: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.soak] if client in MAKE_SOAK_CLIENTS else []


def cases() -> list[Any]:
    return [pytest.param(client, step, id=f"{client}-{step}",
                         marks=marks(client)
                         + ([pytest.mark.xfail(strict=True, reason=reason)]
                            if (reason := EXPECTED_FAILURES.get((client, step))) else []))
            for client in CLIENTS for step in STEPS]


@pytest.fixture(scope="module")
def sdks() -> dict[str, str]:
    """E2B_SDK_PYTHON and E2B_SDK_NODE_MODULES: built once, reused while the pins hold."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (scripts/host-deps.sh installs them)")
    built = subprocess.run(["bash", str(ROOT / "scripts" / "e2b-sdks.sh")],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, f"scripts/e2b-sdks.sh failed:\n{built.stderr[-3000:]}"
    return dict(line.split("=", 1) for line in built.stdout.splitlines() if "=" in line)


def key_for(client: str, server: LiveServer) -> str:
    """Python e2b 2.45.1 refuses a key not shaped `e2b_<hex>` before sending it: it gets
    our key's alias in that form; the JavaScript SDK carries our key as it is."""
    return server.api_key if client == "js" else e2b_key(server.api_key)


@pytest.fixture(scope="module")
def reports(sdks: dict[str, str], live_server: LiveServer
            ) -> Iterator[Callable[[str], dict[str, dict[str, Any]]]]:
    """A client's steps by name, its script run on first use (once per module)."""
    done: dict[str, dict[str, dict[str, Any]]] = {}
    work = owned_tmpdir("pse2b-")
    # ESM resolves packages beside the script, not through NODE_PATH: the script runs from a
    # folder whose node_modules is the cached one.
    (work / "node_modules").symlink_to(sdks["E2B_SDK_NODE_MODULES"])
    for name in ("js_sdk.mjs", "py_sync.py", "py_async.py", "report.py"):
        shutil.copy(CLIENTS_DIR / name, work / name)
    env = {"PATH": os.environ["PATH"], "HOME": str(work),
           "E2B_API_URL": live_server.api_url,
           "E2B_SANDBOX_URL": f"http://127.0.0.1:{live_server.preview_port}"}

    def report(client: str) -> dict[str, dict[str, Any]]:
        if client not in done:
            done[client] = run_client(client, sdks, work,
                                      {**env, "E2B_API_KEY": key_for(client, live_server)})
        return done[client]

    try:
        yield report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_client(client: str, sdks: dict[str, str], work: Path, env: dict[str, str]
               ) -> dict[str, dict[str, Any]]:
    run_id = f"{client}-{uuid.uuid4().hex[:8]}"
    out = work / f"{client}.jsonl"
    argv = {"py-sync": [sdks["E2B_SDK_PYTHON"], "py_sync.py"],
            "py-async": [sdks["E2B_SDK_PYTHON"], "py_async.py"],
            "js": ["node", "js_sdk.mjs"]}[client]
    proc = subprocess.run([*argv, str(out), run_id], cwd=work, env=env, capture_output=True,
                          text=True, timeout=CLIENT_TIMEOUT)
    records = [json.loads(line) for line in
               (out.read_text().splitlines() if out.exists() else [])]
    steps = {r["step"]: r for r in records if r["step"] != "_made"}
    tail = (proc.stdout + proc.stderr)[-3000:]
    # A crash outside a step (an import error, the SDK's own bug) fails the steps it never
    # reached with its output, so it is not read as a server fault.
    for step in STEPS:
        steps.setdefault(step, {"step": step, "ok": False,
                                "error": f"no outcome; exit {proc.returncode}: {tail}"})
    made = [i for r in records if r["step"] == "_made" for i in r["sandboxes"]]
    steps["_run"] = {"run": run_id, "exit": proc.returncode, "output": tail, "made": made}
    return steps


@pytest.mark.parametrize(("client", "step"), cases())
def test_step(client: str, step: str,
              reports: Callable[[str], dict[str, dict[str, Any]]]) -> None:
    outcome = reports(client)[step]
    assert outcome["ok"], f"{outcome['error']} ({outcome.get('where', '')})"


@pytest.mark.parametrize("client", [pytest.param(c, marks=marks(c)) for c in CLIENTS])
def test_nothing_left(client: str, reports: Callable[[str], dict[str, dict[str, Any]]],
                      live_server: LiveServer) -> None:
    """Whatever a client's steps did, every sandbox it made (its own and the fork's child)
    has ended afterwards, as our own SDK sees them, and none else carries its run's
    metadata."""
    run = reports(client)["_run"]
    with Client(api_url=live_server.api_url, api_key=live_server.api_key) as api:
        states = {i: api.sandboxes.get(i).state for i in run["made"]}
        assert states and all(s in ENDED_STATES for s in states.values()), states
        listed = api.sandboxes.list(metadata={"run": run["run"]})
        assert [s.id for s in listed if s.info.state not in ENDED_STATES] == []
