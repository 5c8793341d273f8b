"""`make cluster HOSTS=2` for real (PostgreSQL, the S3 server, two agents in namespaces of their
own, real VMs), a sandbox on each agent through the API server with the SDK, then `make
cluster-down`, after which nothing of it is left. Run alone: `pytest -m cluster`.

Traffic: only to 127.0.0.1 and to the namespaces the cluster makes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from pandastack.sdk import Sandbox
from tests.helpers import vmm_pids_under

pytestmark = [pytest.mark.cluster, pytest.mark.vm, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / ".cluster"
STATE = Path("/var/lib/pandastack-cluster")
RUN = Path("/run/pandastack-cluster")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_has(option: str) -> bool:
    done = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pandastack", "agent", "--help"],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    return option in done.stdout


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def leftovers(record: dict[str, object]) -> list[str]:
    """What of the cluster is still on the machine."""
    left = []
    netns = os.listdir("/run/netns") if Path("/run/netns").is_dir() else []
    left += [f"namespace {n}" for n in netns if n.startswith("pcl-")]
    left += [f"link {n}" for n in os.listdir("/sys/class/net") if n.startswith("pclv")]
    left += [f"path {p}" for p in (STATE, RUN, CLUSTER, Path("/dev/shm/pandastack-memory")
                                   / STATE.relative_to("/")) if p.exists()]
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {line.split()[4]}" for line in mounts.splitlines()
             if "pandastack-cluster" in line]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    left += ["nft table pandastack_cluster"] * ("pandastack_cluster" in tables)
    hosts = record.get("hosts", [])
    assert isinstance(hosts, list)
    pids = [record.get("server_pid"), record.get("relay_pid"), *(h["pid"] for h in hosts)]
    left += [f"process {pid}: {cmdline(int(pid))}" for pid in pids
             if pid is not None and cmdline(int(pid))]
    marks = [str(STATE), *(str(h["endpoint"]).removeprefix("http://") for h in hosts)]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            line = cmdline(int(entry.name))
            if any(mark in line for mark in marks):
                left.append(f"process {entry.name}: {line}")
    left += [f"VMM {pid}" for pid in vmm_pids_under(STATE)]
    return left


def test_make_cluster_runs_sandboxes_on_two_agents_and_down_leaves_nothing(
        tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the cluster needs root (namespaces, VMs)")
    if (CLUSTER / "hosts.json").exists():
        pytest.fail("a cluster is up already in this checkout (make cluster-down)")
    port = free_port()
    config = tmp_path / "xdg" / "pandastack" / "config.json"
    # The admin key goes to a config file of the test's own, not the user's.
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PANDASTACK_DNS": "off"}
    record: dict[str, object] = {}
    try:
        up = subprocess.run(["make", "-s", "cluster", "HOSTS=2", f"CLUSTER_PORT={port}"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        record = json.loads((CLUSTER / "hosts.json").read_text())
        hosts = record["hosts"]
        assert isinstance(hosts, list) and len(hosts) == 2
        assert record["api"] == f"http://127.0.0.1:{port}"
        assert len({h["namespace"] for h in hosts}) == 2
        assert len({h["endpoint"] for h in hosts}) == 2
        assert len({h["home"] for h in hosts}) == 2
        for host in hosts:
            assert cmdline(host["pid"]), f"agent {host['endpoint']} is not running"
            assert (host["host_id"] is not None) == agent_has("--db"), host
        client = json.loads(config.read_text())
        assert client["api_url"] == record["api"]

        boxes = [Sandbox.create(ttl_seconds=600, api_url=client["api_url"],
                                api_key=client["api_key"]) for _ in range(2)]
        try:
            for box in boxes:
                result = box.exec(["cat", "/proc/sys/kernel/hostname"])
                assert result.exit_code == 0 and result.stdout.strip() == box.id, result
            # One on each agent, each in that agent's own state dir.
            where = sorted(h["namespace"] for box in boxes for h in hosts
                           if (Path(h["state_dir"]) / box.id).is_dir())
            assert where == ["pcl-1", "pcl-2"], where
        finally:
            for box in boxes:
                box.kill()
    finally:
        down = subprocess.run(["make", "-s", "cluster-down"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert leftovers(record) == []
    assert not config.exists()  # there was none before: the cluster's key goes with it
