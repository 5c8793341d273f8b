"""A real `pandastack agent` process on a unix socket, with its own state and snapshot
directories under a temporary directory (sharing the template cache under PANDASTACK_HOME),
and the check that nothing of it is left once it is gone."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import httpx

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from tests.helpers import close_private_runtime
from tests.leftovers import owned_tmpdir

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 300.0  # a first run may have to build the guest image


class LiveAgent:
    """`start()` (again after a `signal`: the same dirs, socket and token file)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state_dir = tmp / "s"  # short: unix socket paths must stay under 108 bytes
        self.snapshots_dir = tmp / "snap"
        self.volumes_dir = tmp / "vol"
        self.socket = tmp / "agent.sock"
        self.token_file = tmp / "agent.token"
        self.url = f"unix:{self.socket}"
        self.listen = self.url  # its --listen
        self.log_path = tmp / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args: list[str] = []  # more `pandastack agent` flags (--db, ...)
        # The interpreter whose `pandastack` runs: another release's venv stands in for an
        # agent of that release (tests/server/hosts/test_cluster_upgrade.py).
        self.python = sys.executable

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def probe_client(self) -> httpx.Client:
        """A client of the agent's host API, for the wait in `start`."""
        transport = httpx.HTTPTransport(uds=str(self.socket))
        return httpx.Client(transport=transport, base_url="http://agent")

    def start(self) -> None:
        env = {**os.environ, "PANDASTACK_STATE_DIR": str(self.state_dir),
               "PANDASTACK_SNAPSHOTS_DIR": str(self.snapshots_dir),
               "PANDASTACK_VOLUMES_DIR": str(self.volumes_dir)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "pandastack", "agent", "--listen", self.listen,
                 "--token-file", str(self.token_file), "--log-level", "warning",
                 *self.extra_args],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        with self.probe_client() as client:
            while True:
                with contextlib.suppress(httpx.TransportError, OSError):
                    headers = {"Authorization": f"Bearer {self.token}"}
                    if client.get("/v1/host", headers=headers, timeout=5).status_code == 200:
                        return
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the agent did not come up:\n{self.log_tail()}")
                time.sleep(0.05)

    def signal(self, sig: int, timeout: float = 60) -> int:
        """Send `sig` and wait for the process to end; its exit status."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the agent ignored signal {sig}:\n{self.log_tail()}") from None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


AgentT = TypeVar("AgentT", bound=LiveAgent)


async def leftovers(agent: LiveAgent) -> tuple[list[str], list[str], list[str]]:
    """Kill what the agent's state dir still holds and remove its directories; return the
    sandboxes, snapshots and other entries that were left (empty after a clean run)."""
    for directory in (agent.state_dir, agent.snapshots_dir):  # an agent that never started
        directory.mkdir(parents=True, exist_ok=True)
    config = HostConfig.from_env(state_dir=agent.state_dir, snapshots_root=agent.snapshots_dir,
                                 volumes_root=agent.volumes_dir)
    rt = HostRuntime(config, progress=lambda _m: None)
    await rt.start()
    sandboxes = sorted(h.id for h in rt.list())
    snapshots = sorted(i.id for i in rt.snapshots.all(include_internal=True))
    volumes = [f"volume {v.id}" for v in rt.volumes.store.all()]
    left, _ = await close_private_runtime(rt, agent.state_dir, agent.snapshots_dir)
    shutil.rmtree(agent.volumes_dir, ignore_errors=True)
    return sandboxes, snapshots, [*left, *volumes]


def stop_cleanly(agent: LiveAgent) -> None:
    """SIGTERM, which must end a running agent with status 0."""
    if agent.proc is not None and agent.proc.poll() is None:
        status = agent.signal(signal.SIGTERM)
        assert status == 0, f"SIGTERM: exit status {status}\n{agent.log_tail()}"


async def assert_nothing_left(agent: LiveAgent, what: str = "the tests") -> None:
    """Kill the agent if it still runs, and whatever its dirs still hold (`leftovers`);
    fail on any of it."""
    if agent.proc is not None and agent.proc.poll() is None:
        agent.proc.kill()
        agent.proc.wait()
    sandboxes, snapshots, left = await leftovers(agent)
    assert not sandboxes and not snapshots, (f"left by {what}: sandboxes {sandboxes}, "
                                             f"snapshots {snapshots}")
    assert not [e for e in left if e != ".spare-slots"], f"left in the state dir: {left}"


@contextlib.asynccontextmanager
async def started(agent: AgentT) -> AsyncIterator[AgentT]:
    """`agent` started; on the way out it gets SIGTERM (which must end it cleanly), then
    whatever it left is killed and the test fails on it, and its directory is removed."""
    try:
        agent.start()
        yield agent
        stop_cleanly(agent)
    finally:
        try:
            await assert_nothing_left(agent)
        finally:
            shutil.rmtree(agent.tmp, ignore_errors=True)


def live_agent() -> contextlib.AbstractAsyncContextManager[LiveAgent]:
    """A started agent on a unix socket (`started`)."""
    return started(LiveAgent(owned_tmpdir("pag-")))
