"""docs/operations.md, "Many hosts", run as written (issue 38): its env blocks with only the
guide's placeholders replaced (the bucket and endpoint, the keys, the database, the agents'
address, the token file) by the session's PostgreSQL and S3 server, two network namespaces
standing in for two agent hosts (as scripts/cluster.py makes them: a veth pair with a /30
each, a relay to this namespace's loopback) and a token from `openssl rand -hex 32`; each
host's env file is the shipped one with the block added; doctor as the guide runs it; the
units' ExecStart lines expanded with each host's env file (tests/cli/test_units_exec.py's
helpers; the agents inside their namespaces); `pandastack hosts list` with the first admin
key where the guide says it is; sandboxes on both hosts through the public SDK, a snapshot
on one restored on the other; SIGTERM to each, and nothing left.

Runs in `make test`'s serial lane (marked `serial`; its namespaces' addresses are fixed) and
in `make soak` (`cluster`). Traffic: only to 127.0.0.1 and to the namespaces it makes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pandastack import Client, Sandbox
from pandastack.cli.env_file import read_env_file
from pandastack.cli.main import main
from tests.cli.test_units import unit_settings
from tests.cli.test_units_exec import (
    PANDASTACK,
    confined,
    expand_exec,
    mark,
    stop,
    wait_until,
)
from tests.cluster.test_cluster_script import cluster_script
from tests.helpers import vmm_pids_under
from tests.leftovers import owned_tmpdir
from tests.ports import free_port
from tests.registry.conftest import pg_dsn
from tests.server.live_agent import LiveAgent, assert_nothing_left

__all__ = ["pg_dsn"]

pytestmark = [pytest.mark.cluster, pytest.mark.serial, pytest.mark.vm,
              pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "operations.md"
SUBNET = "10.214.0.0/16"  # not make cluster's 10.213/16 nor the slots' 10.200/16
AGENT_PORT = 7000
HOSTS = 2
# The guide's placeholders (each must still be in it, so that the test follows the guide).
DSN = "postgresql://pandastack:PASSWORD@db.internal/pandastack"
OBJECT_STORE = "s3://BUCKET/PREFIX?endpoint=https://s3.example.net"
TOKEN_FILE = "/etc/pandastack/agent.token"
AGENT_ADDRESS = "10.0.0.11:7000"
ADMIN_CONFIG = "/var/lib/pandastack/client-config.json"


def guide_section(title: str) -> str:
    """The text under the guide's `## N. <title>` heading, to the next `## `."""
    text = GUIDE.read_text()
    found = re.search(rf"^## (?:\d+\. )?{re.escape(title)}\n(.*?)(?=^## )", text, re.M | re.S)
    assert found, f"docs/operations.md has no section {title!r}"
    return found.group(1)


def blocks(section: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)


def localize(block: str, values: dict[str, str]) -> str:
    """`block` with each placeholder (each must be there) replaced by its value."""
    for placeholder, value in values.items():
        assert placeholder in block, f"the guide's block lost {placeholder!r}:\n{block}"
        block = block.replace(placeholder, value)
    assert not re.search(r"example\.net|db\.internal|PASSWORD|BUCKET|=\.\.\.|10\.0\.0\.",
                         block), block
    return block


def netns_name(n: int) -> str:
    return f"pog{n}-{os.getpid()}"


def veth_name(n: int) -> str:
    return f"pogv{n}-{os.getpid() % 100000}"


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=30)


@pytest.fixture
def hosts() -> Iterator[list[tuple[str, str, str]]]:
    """Two agent hosts: (namespace, this side's address, the host's address) each."""
    addresses = cluster_script().addresses
    made: list[tuple[str, str, str]] = []
    try:
        for n in range(1, HOSTS + 1):
            ns, veth = netns_name(n), veth_name(n)
            here, there = addresses(SUBNET, n)
            ip("netns", "add", ns)
            made.append((ns, here, there))
            ip("link", "add", veth, "type", "veth", "peer", "name", "uplink0", "netns", ns)
            ip("addr", "add", f"{here}/30", "dev", veth)
            ip("link", "set", veth, "up")
            for command in (f"addr add {there}/30 dev uplink0", "link set uplink0 up",
                            "link set lo up", f"route add default via {here}"):
                ip("-n", ns, *command.split())
        yield made
    finally:
        # The pair first: a namespace's own links go with it only when the kernel gets to it.
        for n, (ns, _, _) in enumerate(made, start=1):
            subprocess.run(["ip", "link", "del", veth_name(n)], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    left = [f"namespace {ns}" for ns, _, _ in made if Path(f"/run/netns/{ns}").exists()]
    left += [f"link {veth_name(n)}" for n in range(1, HOSTS + 1)
             if Path(f"/sys/class/net/{veth_name(n)}").exists()]
    assert left == []


def in_host(ns: str, argv: list[str]) -> list[str]:
    """`argv` in host `ns`'s network namespace (as make cluster's agents: not `ip netns
    exec`, whose mount namespace would hide the sandboxes' namespaces from this one's checks
    of what is left)."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--", *argv]


async def test_many_hosts_as_the_guide_writes_it(hosts: list[tuple[str, str, str]],
                                                 pg_dsn: str, s3_env: dict[str, str]) -> None:
    section = guide_section("Many hosts")
    agent_block, serve_block = blocks(section)[:2]
    tmp = owned_tmpdir("pog-")
    procs: list[subprocess.Popen[bytes]] = []
    agents = [LiveAgent(tmp / f"h{n}") for n in range(1, HOSTS + 1)]
    try:
        _run(tmp, section, agent_block, serve_block, hosts, agents, procs, pg_dsn, s3_env)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        try:
            for agent in agents:
                agent.tmp.mkdir(parents=True, exist_ok=True)
                await assert_nothing_left(agent, "the guide's cluster")
            assert vmm_pids_under(tmp) == []
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(tmp: Path, section: str, agent_block: str, serve_block: str,
         hosts: list[tuple[str, str, str]], agents: list[LiveAgent],
         procs: list[subprocess.Popen[bytes]], dsn: str, s3_env: dict[str, str]) -> None:
    script = cluster_script()
    assert main(["install-units", "--prefix", str(tmp / "root"), "--bin", PANDASTACK]) == 0
    units = tmp / "root" / "etc/systemd/system"
    agent_unit = unit_settings((units / "pandastack-agent.service").read_text())
    serve_unit = unit_settings((units / "pandastack-serve.service").read_text())
    shipped = (tmp / "root" / "etc/pandastack/pandastack.env").read_text()

    # "/etc/pandastack/agent.token holding one random line, e.g. from openssl rand -hex 32"
    token = tmp / "agent.token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        subprocess.run(["openssl", "rand", "-hex", "32"], stdout=f, check=True, timeout=30)
    assert re.fullmatch(r"[0-9a-f]{64}\n", token.read_text())

    object_store = f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/guide-{os.getpid()}" \
        f"?endpoint={s3_env['PANDASTACK_S3_ENDPOINT']}"
    keys = {"PANDASTACK_S3_ACCESS_KEY=...":
            f"PANDASTACK_S3_ACCESS_KEY={s3_env['PANDASTACK_S3_ACCESS_KEY']}",
            "PANDASTACK_S3_SECRET_KEY=...":
            f"PANDASTACK_S3_SECRET_KEY={s3_env['PANDASTACK_S3_SECRET_KEY']}"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("PANDASTACK_")}

    def env_of(path: Path, text: str, unit: dict[str, list[str]]) -> dict[str, str]:
        """The host's env file (shipped, then the guide's lines, then what keeps this run
        private: an operator's further edits, as it were) and the environment systemd
        gives the unit from it."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{shipped}\n# docs/operations.md, Many hosts\n{text}")
        env = dict(base)
        for assignment in unit.get("Environment", []):
            key, _, value = assignment.partition("=")
            env[key] = value
        env.update(read_env_file(path))
        return env

    # The agents reach this namespace's PostgreSQL and S3 server through the relay on their
    # veth's address here, as make cluster's do.
    db_port = httpx.URL(dsn.replace("+psycopg", "")).port
    s3_port = httpx.URL(s3_env["PANDASTACK_S3_ENDPOINT"]).port
    pairs = [f"{here}:{port}=127.0.0.1:{port}" for _, here, _ in hosts
             for port in (db_port, s3_port)]
    relay_log = tmp / "relay.log"
    with relay_log.open("wb") as log:
        procs.append(subprocess.Popen([str(ROOT / ".venv/bin/python"),
                                       str(ROOT / "scripts/cluster.py"), "relay", *pairs],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=tmp))

    agent_procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    endpoints = []
    for (ns, here, there), agent in zip(hosts, agents, strict=True):
        agent.tmp.mkdir()
        text = localize(agent_block, {
            OBJECT_STORE: script.via(object_store, here), **keys,
            DSN: script.via(dsn, here), AGENT_ADDRESS: f"{there}:{AGENT_PORT}",
            TOKEN_FILE: str(token)})
        text += (f"PANDASTACK_STATE_DIR={agent.state_dir}\n"
                 f"PANDASTACK_SNAPSHOTS_DIR={agent.snapshots_dir}\n"
                 f"PANDASTACK_VOLUMES_DIR={agent.volumes_dir}\n")
        env = env_of(agent.tmp / "pandastack.env", text, agent_unit)
        argv = expand_exec(agent_unit["ExecStart"][0], env)
        assert argv[:2] == [PANDASTACK, "agent"] and f"http://{there}:{AGENT_PORT}" in argv
        with agent.log_path.open("wb") as log:
            proc = subprocess.Popen(in_host(ns, [*confined(agent_unit), *argv]), env=env,
                                    stdout=log, stderr=subprocess.STDOUT, cwd=agent.tmp)
        procs.append(proc)
        agent_procs.append((proc, agent.log_path))
        endpoints.append(f"http://{there}:{AGENT_PORT}")
    for (proc, agent_log), endpoint in zip(agent_procs, endpoints, strict=True):
        wait_until(lambda e=endpoint: httpx.get(f"{e}/v1/host", timeout=5, headers={
            "Authorization": f"Bearer {token.read_text().strip()}"}).status_code == 200,
            proc, agent_log)

    port = free_port()
    admin_config = tmp / "client-config.json"
    serve_env_file = tmp / "serve.env"
    text = localize(serve_block, {OBJECT_STORE: object_store, **keys, DSN: dsn,
                                  TOKEN_FILE: str(token)})
    serve_env = env_of(serve_env_file, text + (
        f"PANDASTACK_PORT={port}\nPANDASTACK_PREVIEW_PORT=0\n"
        f"PANDASTACK_CLIENT_CONFIG={admin_config}\n"), serve_unit)
    assert serve_env["PANDASTACK_CLUSTER"] == "1" and serve_env["PANDASTACK_AGENT"] == ""

    # "pandastack doctor --role serve --env-file /etc/pandastack/pandastack.env (the
    # database and the object store must answer)"
    doctor = subprocess.run([PANDASTACK, "doctor", "--role", "serve", "--env-file",
                             str(serve_env_file), "--json"], env=base, capture_output=True,
                            text=True, timeout=120, cwd=tmp)
    found = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    for name in ("settings", "database", "object store"):
        assert found[name]["status"] == "ok", (found[name], doctor.stderr)

    serve_log = tmp / "serve.log"
    serve_argv = expand_exec(serve_unit["ExecStart"][0], serve_env)
    assert serve_argv == [PANDASTACK, "serve"]
    with serve_log.open("wb") as log:
        serve = subprocess.Popen([*confined(serve_unit), *serve_argv], env=serve_env,
                                 stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    procs.append(serve)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, serve,
               serve_log)

    # The guide's `pandastack hosts list` block, with the admin key where serve wrote it.
    listing = next(b for b in blocks(section) if "pandastack hosts list" in b)
    home = tmp / "operator"
    home.mkdir()
    # PATH: the venv's bin stands in for section 1's /usr/local/bin/pandastack link.
    operator = {**base, "HOME": str(home),
                "PATH": f"{Path(PANDASTACK).parent}:{base.get('PATH', '/usr/bin:/bin')}"}
    operator.pop("XDG_CONFIG_HOME", None)
    listed = subprocess.run(["sh", "-ec", localize(listing, {ADMIN_CONFIG: str(admin_config)})],
                            env=operator, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    for endpoint in endpoints:
        assert endpoint in listed.stdout, listed.stdout
    key = json.loads(admin_config.read_text())["api_key"]
    with Client(api_url=url, api_key=key) as admin:
        ids = {h.endpoint: h.id for h in admin.hosts.list()}
    a, b = (ids[e] for e in endpoints)

    with Sandbox.create(template="base", ttl_seconds=300, api_url=url, api_key=key,
                        host_id=a) as first, \
         Sandbox.create(template="base", ttl_seconds=300, api_url=url, api_key=key,
                        host_id=b) as second:
        assert (first.info.host_id, second.info.host_id) == (a, b)
        mark(first, "echo served > /tmp/mark && cat /tmp/mark")
        mark(second, "echo served > /tmp/mark && cat /tmp/mark")
        snapshot = first.snapshot()  # through the object store: A uploads, B fetches
        with Sandbox.create(snapshot=snapshot, api_url=url, api_key=key, host_id=b) as copy:
            assert copy.info.host_id == b
            mark(copy)
        with Client(api_url=url, api_key=key) as admin:
            admin.snapshots.delete(snapshot)

    # systemctl stop: the API server, then each agent (their VMs are gone with the kills).
    stop(serve, serve_log)
    for proc, agent_log in agent_procs:
        stop(proc, agent_log)
    stop(procs[0], relay_log)
