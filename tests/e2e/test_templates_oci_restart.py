"""A team template FROM an OCI image outlives a restart (issue 37): built, then `pandastack
serve` restarted (in agent mode the agent too), a sandbox is created from it and sees the
image's and the build's files, and a rebuild reads nothing from the registry but the manifest:
the guest image made of the cached layers is used again (no layer pulled, no disk made) and
every step comes from the step cache. Real processes, real VMs, the loopback registry."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack import Client, Sandbox
from pandastack.server.hostclient import HostClient
from tests.e2e.test_server_restart import started_serve
from tests.host.images.oci.conftest import needs_registry, registry, skopeo_policy
from tests.host.images.oci.helpers import push_image
from tests.host.images.oci.layers import busybox_layer, file, gzipped
from tests.host.images.oci.registry import Registry
from tests.ports import free_port
from tests.server.live import terminate, wait_healthy
from tests.server.live_agent import LiveAgent, live_agent

pytestmark = [pytest.mark.e2e, pytest.mark.vm, needs_registry, pytest.mark.timeout(1500)]
__all__ = ["registry", "skopeo_policy"]  # the OCI tests' fixtures, used here by name

ROOT = Path(__file__).resolve().parents[2]
STEP = "RUN echo built > /built"


@pytest.fixture
def image(registry: Registry, skopeo_policy: Path, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A busybox image with a marker file on the loopback registry, which the servers and
    agents started by the test may pull from (the operator's setting, in their environment);
    the image's name and its marker."""
    marker = uuid.uuid4().hex
    name = f"tests/restart-{marker[:8]}"
    push_image(registry, tmp_path, skopeo_policy, name,
               [gzipped(busybox_layer()), gzipped([file("marker", marker + "\n")])],
               config={"Env": ["PATH=/usr/bin:/bin"]})
    monkeypatch.setenv("PANDASTACK_INSECURE_REGISTRIES", registry.host)
    # Cache entries outlive the build here (other e2e servers keep none).
    monkeypatch.setenv("PANDASTACK_BUILD_CACHE_ENTRIES", "8")
    yield f"{registry.host}/{name}:v1", marker


def build(client: Client, image: str) -> list[str]:
    lines: list[str] = []
    info = client.templates.build(f"FROM {image}\n{STEP}\n", "from-image", on_log=lines.append)
    assert info.status == "ready", (info, lines[-20:])
    return lines


def assert_served_again(client: Client, api_url: str, api_key: str, marker: str,
                        image: str) -> None:
    """After the restart: a sandbox of the template has the image's and the build's files;
    a rebuild pulls no layer, makes no disk and runs no step."""
    with Sandbox.create(template="from-image", ttl_seconds=300, api_url=api_url,
                        api_key=api_key) as sbx:
        probe = sbx.exec("cat /marker /built")
        assert (probe.exit_code, probe.stdout) == (0, f"{marker}\nbuilt\n"), probe
    lines = build(client, image)
    assert f"Step 1/1 {STEP} (cached)" in lines, lines
    assert not [line for line in lines if ": pulling" in line or "mkfs" in line], lines
    assert [v.status for v in client.templates.get("from-image").versions] == ["ready"] * 2
    client.templates.delete("from-image")


def test_serve_restarted(image: tuple[str, str], tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    reference, marker = image
    # The templates' and the step cache's snapshots: the test's own, removed with tmp_path.
    monkeypatch.setenv("PANDASTACK_SNAPSHOTS_DIR", str(tmp_path / "snapshots"))
    with started_serve("psr-") as server:  # the restart tests' kind of directory
        first = build(Client(server.url, server.api_key()), reference)
        assert any(f"{reference}: sha256:" in line for line in first), first
        server.signal(signal.SIGTERM)
        server.start(timeout=300)
        assert_served_again(Client(server.url, server.api_key()), server.url,
                            server.api_key(), marker, reference)


class AgentServe:
    """`pandastack serve --agent` in front of `agent`, on a database under the agent's dir."""

    def __init__(self, agent: LiveAgent) -> None:
        self.agent = agent
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = agent.tmp / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        tmp = self.agent.tmp
        env = {**os.environ, "PANDASTACK_DB": f"sqlite:///{tmp / 'server.db'}",
               "PANDASTACK_PORT": str(self.port),
               "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
               "PANDASTACK_STATE_DIR": str(self.agent.state_dir)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pandastack", "serve", "--agent", self.agent.url,
                 "--agent-token-file", str(self.agent.token_file)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_healthy(self.url, self.proc, self.log, 120)

    def api_key(self) -> str:
        key: str = json.loads((self.agent.tmp / "client.json").read_text())["api_key"]
        return key

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 30)
            self.proc = None


async def test_agent_and_serve_restarted(image: tuple[str, str]) -> None:
    reference, marker = image
    async with live_agent() as agent:
        serve = AgentServe(agent)
        try:
            serve.start()
            build(Client(serve.url, serve.api_key()), reference)
            serve.stop()
            assert agent.signal(signal.SIGTERM) == 0, agent.log_tail()
            agent.start()
            serve.start()
            assert_served_again(Client(serve.url, serve.api_key()), serve.url,
                                serve.api_key(), marker, reference)
        finally:
            serve.stop()
            # The step cache's snapshots are the agent's, and live_agent fails on any left
            # (a failure here leaves them to that check, not in place of the test's error).
            host = HostClient(agent.url, agent.token)
            with contextlib.suppress(Exception):
                await host.start()
                await host.prune_build_cache(0)
            await host.close()
