"""What a user starts: `make cluster HOSTS=2` for real (PostgreSQL, the S3 server, two agents in
namespaces of their own, real VMs), driven only through the public SDK on its API server;
then `make cluster-down`, after which nothing of it is left (issue 33). One cluster for the
module, its checks in the order a user would meet them: then the rolling upgrade of
docs/operations.md, "Upgrades", its commands as written there, with the sandboxes the snapshot
test made across the agents running on (issue 38); the agent killed last, its subjects the
same sandboxes and one made on it (no more VMs booted for it).

It runs in `make test`'s serial lane (marked `serial`) and in `make soak` (`cluster`).
Traffic: only to 127.0.0.1 and to the namespaces the cluster makes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pandastack
from pandastack.hostport.compat import HOST_PROTOCOL
from pandastack.sdk import Client, Sandbox
from pandastack.sdk.errors import PermissionDeniedError
from tests.helpers import HOLDER, vmm_pids_under
from tests.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.serial, pytest.mark.vm,
              pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / ".cluster"
STATE = Path("/var/lib/pandastack-cluster")
RUN = Path("/run/pandastack-cluster")
# The agents' --stale-after-s is 15 s; the server notices at its next look at the registry.
LOST_WITHIN_S = 120.0
TTL_S = 900  # a backstop: every sandbox is killed or goes with the cluster


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


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


def make(targets: list[str], env: dict[str, str], timeout: float
         ) -> subprocess.CompletedProcess[str]:
    """`make -s TARGETS` as a user runs it; past `timeout`, its whole process group is
    stopped, so that a hung `up` is not still starting things while `down` removes them."""
    proc = subprocess.Popen(["make", "-s", *targets], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(make {' '.join(targets)}: stopped after {timeout:.0f} s)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@dataclass(frozen=True)
class Cluster:
    api_url: str
    api_key: str
    hosts: list[dict[str, object]]  # hosts.json's at the start, agent 1 first
    env: dict[str, str]  # the test's environment for `make` and `pandastack`

    @property
    def host_ids(self) -> list[str]:
        return [str(h["host_id"]) for h in self.hosts]

    def create(self, **options: Any) -> Sandbox:
        return Sandbox.create(ttl_seconds=TTL_S, api_url=self.api_url, api_key=self.api_key,
                              **options)

    def agent_pid(self, host_id: str) -> int:
        """The pid of the host's agent now (a restart gives it another)."""
        record = json.loads((CLUSTER / "hosts.json").read_text())
        return int(next(h["pid"] for h in record["hosts"] if h["host_id"] == host_id))

    def pandastack(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The `pandastack` command as an operator runs it, with the cluster's admin key."""
        done = subprocess.run([str(ROOT / ".venv" / "bin" / "pandastack"), *args],
                              env={**self.env, "PANDASTACK_API": self.api_url,
                                   "PANDASTACK_API_KEY": self.api_key},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"pandastack {' '.join(args)}: {done.stderr}"
        return done

    def make(self, *targets: str) -> None:
        done = make(list(targets), self.env, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def hosts_now(self) -> dict[str, dict[str, Any]]:
        with Client(self.api_url, self.api_key) as admin:
            return {h.id: h.model_dump() for h in admin.hosts.list()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.fail("the cluster needs root (namespaces, VMs)")
    if (CLUSTER / "hosts.json").exists():
        pytest.fail("a cluster is up already in this checkout (make cluster-down)")
    xdg = tmp_path_factory.mktemp("xdg")
    config = xdg / "pandastack" / "config.json"
    port = free_port()  # not 8080: other tests' servers and the user's `make run` use it
    # The admin key goes to a config file of the test's own, not the user's.
    env = {**os.environ, "XDG_CONFIG_HOME": str(xdg), "PANDASTACK_DNS": "off"}
    record: dict[str, object] = {}
    try:
        up = make(["cluster", "HOSTS=2", f"CLUSTER_PORT={port}"], env, timeout=1800)
        if (CLUSTER / "hosts.json").exists():
            record = json.loads((CLUSTER / "hosts.json").read_text())
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        hosts = record["hosts"]
        assert isinstance(hosts, list) and len(hosts) == 2
        assert record["api"] == f"http://127.0.0.1:{port}"
        assert len({h["namespace"] for h in hosts}) == 2
        assert len({h["endpoint"] for h in hosts}) == 2
        assert len({h["home"] for h in hosts}) == 2
        for host in hosts:
            assert cmdline(host["pid"]), f"agent {host['endpoint']} is not running"
            assert host["host_id"], f"agent {host['endpoint']} did not register"
        client = json.loads(config.read_text())
        assert client["api_url"] == record["api"]
        yield Cluster(client["api_url"], client["api_key"], hosts, env)
    finally:
        down = make(["cluster-down"], env, timeout=600)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert leftovers(record) == []
    assert not config.exists()  # there was none before: the cluster's key goes with it


def holder(sbx: Sandbox) -> tuple[int, str]:
    """Start the memory holder in `sbx`: its pid and the value it holds."""
    pid = sbx.commands.start(["python3", "-c", HOLDER]).pid
    until("the holder to start",
          lambda: len(sbx.exec(["cat", "/tmp/value"]).stdout) == 16, timeout=60)
    return pid, sbx.exec(["cat", "/tmp/value"]).stdout


def told(sbx: Sandbox, pid: int) -> str:
    """What the holder `pid` keeps in its memory now (it must be alive to tell)."""
    script = (f"rm -f /tmp/told; kill -USR1 {pid} || exit 3; "
              "for i in $(seq 50); do [ -s /tmp/told ] && exec cat /tmp/told; sleep 0.1; "
              "done; exit 4")
    result = sbx.exec(["sh", "-c", script])
    assert result.exit_code == 0, result
    return result.stdout


@dataclass(frozen=True)
class Across:
    """A sandbox on agent 1 running the memory holder, and two on agent 2 made from it (from
    its snapshot, and its fork): the snapshot test's subjects, then the killed agent's (one
    on the agent that dies, more on the other), so that test boots no three more VMs."""

    src: Sandbox
    pid: int
    value: str
    restored: Sandbox
    child: Sandbox


@pytest.fixture(scope="module")
def across(cluster: Cluster) -> Iterator[Across]:
    a, b = cluster.host_ids
    made = [cluster.create(host_id=a)]
    try:
        pid, value = holder(made[0])
        # Through the object store: A uploads, B fetches (issue 33: this was a 503).
        made.append(cluster.create(snapshot=made[0].snapshot(), host_id=b))
        # Streamed from A to B, agent to agent across their namespaces.
        made += made[0].fork(host_id=b)
        yield Across(made[0], pid, value, made[1], made[2])
    finally:
        for box in made:
            box.kill()


def test_creates_spread_over_both_agents_each_in_its_own_state(cluster: Cluster) -> None:
    boxes = [cluster.create() for _ in range(2)]
    try:
        assert sorted(str(b.info.host_id) for b in boxes) == sorted(cluster.host_ids)
        for box in boxes:
            result = box.exec(["cat", "/proc/sys/kernel/hostname"])
            assert result.exit_code == 0 and result.stdout.strip() == box.id, result
            home = next(h for h in cluster.hosts if h["host_id"] == box.info.host_id)
            assert (Path(str(home["state_dir"])) / box.id).is_dir()
    finally:
        for box in boxes:
            box.kill()


def test_a_snapshot_on_one_agent_creates_and_a_fork_runs_on_the_other(
        cluster: Cluster, across: Across) -> None:
    a, b = cluster.host_ids
    assert across.src.info.host_id == a
    for made in (across.restored, across.child):
        assert made.info.host_id == b
        assert told(made, across.pid) == across.value
    assert told(across.src, across.pid) == across.value  # the parent runs on


def test_only_an_admin_key_chooses_the_host(cluster: Cluster) -> None:
    with Client(cluster.api_url, cluster.api_key) as admin:
        team_key = admin.keys.create("team-key").key
        with pytest.raises(PermissionDeniedError):
            Sandbox.create(host_id=cluster.host_ids[0], ttl_seconds=TTL_S,
                           api_url=cluster.api_url, api_key=team_key)
        # The same key without host_id creates, so the 403 is the pin's alone; and it may
        # not pin that sandbox's forks either.
        box = Sandbox.create(ttl_seconds=TTL_S, api_url=cluster.api_url, api_key=team_key)
        try:
            with pytest.raises(PermissionDeniedError):
                box.fork(host_id=cluster.host_ids[1])
        finally:
            box.kill()


def test_a_rolling_upgrade_keeps_the_sandboxes_and_their_processes(
        cluster: Cluster, across: Across) -> None:
    """docs/operations.md, "Upgrades", as written there, each agent in turn, then the API
    server; `make cluster-agent-stop|start` and `make cluster-serve-restart` do what its
    `systemctl` lines do on a host (SIGTERM to that process alone, the same start). The
    memory holder's value is asked of the first sandbox (moved by both drains) after every
    step, and of all three after each agent's turn."""
    boxes = [across.src, across.restored, across.child]

    def still(*which: Sandbox) -> None:
        for box in which or boxes[:1]:
            assert told(box, across.pid) == across.value, box.id

    listed = json.loads(cluster.pandastack("hosts", "list", "--json").stdout)
    assert [(h["state"], h["version"], h["protocol"]) for h in listed] == \
        [("live", pandastack.__version__, HOST_PROTOCOL)] * 2
    assert cluster.pandastack("--version").stdout == f"pandastack {listed[0]['version']}\n"
    for n, host in enumerate(cluster.host_ids, start=1):
        held = [box.id for box in boxes if box.refresh().host_id == host]
        assert across.src.id in held
        drained = cluster.pandastack("hosts", "drain", host).stdout
        assert sorted(line.split()[1] for line in drained.splitlines()
                      if line.startswith("moved ")) == sorted(held), drained
        assert all(box.refresh().host_id != host for box in boxes)
        still()
        cluster.make("cluster-agent-stop", f"AGENT={n}")
        still()
        restarted = time.time()
        cluster.make("cluster-agent-start", f"AGENT={n}")
        # Registered again before it listens, so at once: not stale, still draining, and its
        # heartbeat is the new agent's (younger than the start; 0.5 s for rounding and the
        # database's clock), not the stopped one's. Not `< 5`: with a 5 s heartbeat, a late
        # beat under load made that older.
        again = cluster.hosts_now()[host]
        since_start = time.time() - restarted
        assert again["state"] == "draining", again
        assert again["heartbeat_age_seconds"] <= since_start + 0.5, (again, since_start)
        still()
        undrained = cluster.pandastack("hosts", "undrain", host).stdout
        assert undrained == f"{host} is live: it takes new sandboxes\n"
        still(*boxes)
    cluster.make("cluster-serve-restart")
    still(*boxes)
    assert {h["state"] for h in cluster.hosts_now().values()} == {"live"}


def test_a_killed_agent_loses_its_sandboxes_and_creates_go_to_the_other(
        cluster: Cluster, across: Across) -> None:
    """Last: the agent killed stays dead (make cluster-down takes its orphaned VMs). It is
    the one holding fewer of the snapshot test's sandboxes (after the rolling upgrade,
    none), plus one made on it: a create that still counted it in would go there."""
    boxes = [across.src, across.restored, across.child]
    where = {box.id: box.refresh().host_id for box in boxes}
    a, b = cluster.host_ids
    dead = a if sum(h == a for h in where.values()) < len(boxes) / 2 else b
    alive = b if dead == a else a
    made: list[Sandbox] = [cluster.create(host_id=dead)]
    lost = [made[0], *(box for box in boxes if where[box.id] == dead)]
    kept = [box for box in boxes if where[box.id] == alive]
    assert kept
    try:
        os.kill(cluster.agent_pid(dead), signal.SIGKILL)
        until(f"{[box.id for box in lost]} to be host_lost",
              lambda: all(box.refresh().state == "host_lost" for box in lost),
              timeout=LOST_WITHIN_S)
        made.append(cluster.create())
        assert made[-1].info.host_id == alive
        assert made[-1].exec(["true"]).exit_code == 0
        assert [box.refresh().state for box in kept] == ["running"] * len(kept)
        assert kept[0].exec(["true"]).exit_code == 0
    finally:
        for box in made:
            box.kill()
