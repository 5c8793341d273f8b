"""The exact command lines of the systemd units, run as systemd would run them (PID 1 here is
not systemd): ExecStart expanded with the installed env file's variables, under the unit's
capability bounding set (setpriv stands in for CapabilityBoundingSet and NoNewPrivileges).
The agent's, then the API server's driving it; a sandbox made through both, with a volume,
that outlives a restart of the agent and is paused, snapshotted, forked and hibernated, shows
that the agent's capabilities are enough for those paths; SIGTERM (systemd's stop) ends each
cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pandastack import Client, Sandbox
from pandastack.cli.env_file import read_env_file
from pandastack.cli.main import main
from tests.cli.test_units import unit_settings
from tests.leftovers import owned_tmpdir
from tests.ports import free_port
from tests.server.live_agent import LiveAgent, assert_nothing_left

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PANDASTACK = str(ROOT / ".venv" / "bin" / "pandastack")
START_TIMEOUT_S = 600.0  # a first run may build the guest image and bake the base template


def expand_exec(line: str, env: dict[str, str]) -> list[str]:
    """ExecStart's words as systemd makes them: `$VAR` alone is split at whitespace (nothing
    when empty), `${VAR}` is one word."""
    argv: list[str] = []
    for word in shlex.split(line):
        alone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if alone:
            argv.extend(env.get(alone.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                           lambda m: env.get(m.group(1), ""), word))
    return argv


def test_expand_exec() -> None:
    env = {"A": "--x 1", "E": ""}
    assert expand_exec("/bin/p agent $A $E ${A}", env) == ["/bin/p", "agent", "--x", "1",
                                                            "--x 1"]


def mark(sbx: Sandbox, command: str = "cat /tmp/mark", out: str = "served\n") -> None:
    run = sbx.exec(command, timeout_seconds=120)
    assert (run.exit_code, run.stdout) == (0, out), run


def confined(unit: dict[str, list[str]]) -> list[str]:
    """setpriv's prefix for the unit's CapabilityBoundingSet and NoNewPrivileges."""
    caps = unit["CapabilityBoundingSet"][0].split()
    bounding = ",".join(["-all", *(f"+{c.removeprefix('CAP_').lower()}" for c in caps)])
    prefix = ["setpriv", f"--bounding-set={bounding}"]
    if unit.get("NoNewPrivileges") == ["yes"]:
        prefix.append("--no-new-privs")
    return prefix


def wait_until(ready: object, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with contextlib.suppress(httpx.TransportError, OSError):
            if ready():  # type: ignore[operator]
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    """systemd's stop: SIGTERM (KillSignal), then a clean end: status 0 or death by that
    SIGTERM, which systemd counts as clean too (uvicorn, which serve runs on, raises the
    signal that stopped it again once it has shut down)."""
    proc.send_signal(signal.SIGTERM)
    try:
        status = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"ignored SIGTERM:\n{log.read_text()[-3000:]}") from None
    assert status in (0, -signal.SIGTERM), \
        f"SIGTERM: exit status {status}\n{log.read_text()[-3000:]}"


@pytest.fixture
def staged() -> Iterator[Path]:
    tmp = owned_tmpdir("pun-")  # short: unix socket paths
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def test_the_units_command_lines_serve_a_sandbox(staged: Path) -> None:
    assert main(["install-units", "--prefix", str(staged / "root"), "--bin", PANDASTACK]) == 0
    units = staged / "root" / "etc/systemd/system"
    agent_unit = unit_settings((units / "pandastack-agent.service").read_text())
    serve_unit = unit_settings((units / "pandastack-serve.service").read_text())
    live = LiveAgent(staged)  # its layout, for the leftovers check at the end
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PANDASTACK_")}
    # The unit's Environment=, then its EnvironmentFile= (which wins), then what makes this
    # run private to the test (an operator's edit of the env file, as it were).
    for assignment in serve_unit.get("Environment", []):
        key, _, value = assignment.partition("=")
        env[key] = value
    env.update(read_env_file(staged / "root" / "etc/pandastack/pandastack.env"))
    env.update({
        "PANDASTACK_STATE_DIR": str(live.state_dir),
        "PANDASTACK_SNAPSHOTS_DIR": str(live.snapshots_dir),
        "PANDASTACK_VOLUMES_DIR": str(live.volumes_dir),
        "PANDASTACK_AGENT_ARGS": f"--listen unix:{live.socket} --token-file {live.token_file}",
        "PANDASTACK_AGENT": f"unix:{live.socket}",
        "PANDASTACK_AGENT_TOKEN_FILE": str(live.token_file),
        "PANDASTACK_DB": f"sqlite:///{staged / 'api.db'}",
        "PANDASTACK_PORT": str(port),
        "PANDASTACK_PREVIEW_PORT": "0",
        "PANDASTACK_CLIENT_CONFIG": str(staged / "client.json"),
    })
    agent_argv = expand_exec(agent_unit["ExecStart"][0], env)
    assert agent_argv[:2] == [PANDASTACK, "agent"] and "--listen" in agent_argv
    serve_argv = expand_exec(serve_unit["ExecStart"][0], env)
    assert serve_argv == [PANDASTACK, "serve"]
    agent_log, serve_log = staged / "agent.log", staged / "serve.log"
    procs: list[subprocess.Popen[bytes]] = []

    def start_agent() -> subprocess.Popen[bytes]:
        with agent_log.open("ab") as log:
            agent = subprocess.Popen([*confined(agent_unit), *agent_argv], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, cwd="/")
        procs.append(agent)
        transport = httpx.HTTPTransport(uds=str(live.socket))
        with httpx.Client(transport=transport, base_url="http://agent") as client:
            wait_until(lambda: client.get("/v1/host", timeout=5, headers={
                "Authorization": f"Bearer {live.token}"}).status_code == 200, agent, agent_log)
        return agent

    try:
        agent = start_agent()
        with serve_log.open("wb") as log:
            serve = subprocess.Popen([*confined(serve_unit), *serve_argv], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, cwd="/")
        procs.append(serve)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, serve,
                   serve_log)
        key = json.loads((staged / "client.json").read_text())["api_key"]
        client = Client(api_url=url, api_key=key)
        client.volumes.create("unit-vol", size_mb=64)
        with Sandbox.create(template="base", ttl_seconds=300, api_url=url, api_key=key,
                            volumes=[{"name": "unit-vol", "mount_path": "/data"}]) as sbx:
            mark(sbx, "echo served > /tmp/mark && echo kept > /data/mark && cat /tmp/mark")
            # A restart of the agent's unit (KillMode=process: the agent alone is stopped):
            # the sandbox's VM keeps running and the next start re-adopts it, memory and all.
            stop(agent, agent_log)
            agent = start_agent()
            mark(sbx)
            # The other paths of the agent that need privileges, under its bounding set:
            # pause, a snapshot and a sandbox from it, a fork, hibernation and waking.
            sbx.pause()
            sbx.resume()
            snapshot = sbx.snapshot()
            with Sandbox.create(snapshot=snapshot, api_url=url, api_key=key) as copy:
                mark(copy)
            client.snapshots.delete(snapshot)
            (child,) = sbx.fork(1)
            with child:
                mark(child)
            sbx.set_persistent(True)
            sbx.hibernate()
            sbx.wake()
            mark(sbx, "cat /tmp/mark /data/mark", "served\nkept\n")
        # The volume and the copies of it that the sandbox from the snapshot and the fork's
        # child got (read-write volumes are copied, never shared).
        names = [v.name for v in client.volumes.list()]
        assert "unit-vol" in names and len(names) == 3, names
        for name in names:
            client.volumes.delete(name)
        client.close()
        stop(serve, serve_log)
        stop(agent, agent_log)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await assert_nothing_left(live, "the units' command lines")
