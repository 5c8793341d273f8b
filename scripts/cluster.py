#!/usr/bin/env python3
"""`make cluster HOSTS=N` / `make cluster-down`: N `pandastack agent` processes on this
machine (one template cache, a state dir each) and one API server on 127.0.0.1:8080 that
drives them as a pool, for development and tests. Writes `.cluster/hosts.json` in the
checkout (git-ignored): each agent's host id (its address), pid, state dir and log, and the
server's pid, so that a test can stop one. `down` stops all of it (SIGTERM, then SIGKILL),
kills the sandboxes the agents still hold, and removes the directory.

Not yet (issue 17): PostgreSQL and the object store, each agent in its own network namespace
with private mounts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / ".cluster"
STATE = Path(os.environ.get("PANDASTACK_CLUSTER_DIR", "/var/lib/pandastack-cluster"))
START_TIMEOUT = 300.0


def wait_for(check: object, what: str, log: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not check():  # type: ignore[operator]
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise SystemExit(f"{what} did not come up:\n{tail}")
        time.sleep(0.1)


def up(hosts: int, port: int) -> int:
    if (CLUSTER / "hosts.json").exists():
        raise SystemExit("a cluster is up already (make cluster-down first)")
    CLUSTER.mkdir(exist_ok=True)
    python = sys.executable
    agents = []
    for n in range(1, hosts + 1):
        state = STATE / f"host-{n}"
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = CLUSTER / f"agent-{n}.log"
        sock = state / "agent.sock"
        env = {**os.environ, "PANDASTACK_STATE_DIR": str(state)}
        with log.open("ab") as out:
            proc = subprocess.Popen([python, "-m", "pandastack", "agent", "--listen",
                                     f"unix:{sock}"], cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        agents.append({"host_id": f"unix:{sock}", "pid": proc.pid, "state_dir": str(state),
                       "log": str(log), "proc": proc})
    for agent in agents:
        sock = Path(str(agent["state_dir"])) / "agent.sock"
        wait_for(sock.exists, f"agent {agent['host_id']}", Path(str(agent["log"])),
                 agent["proc"])  # type: ignore[arg-type]
    log = CLUSTER / "server.log"
    env = {**os.environ, "PANDASTACK_AGENT": ",".join(str(a["host_id"]) for a in agents),
           "PANDASTACK_PORT": str(port), "PANDASTACK_DB": f"sqlite:///{STATE / 'cluster.db'}"}
    with log.open("ab") as out:
        server = subprocess.Popen([python, "-m", "pandastack", "serve"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def healthy() -> bool:
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(healthy, "the API server", log, server)
    record = {"api": f"http://127.0.0.1:{port}", "server_pid": server.pid,
              "server_log": str(log), "state": str(STATE),
              "hosts": [{k: v for k, v in a.items() if k != "proc"} for a in agents]}
    (CLUSTER / "hosts.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


def _stop(pid: int, timeout: float = 30.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def down() -> int:
    path = CLUSTER / "hosts.json"
    record = json.loads(path.read_text()) if path.exists() else {"hosts": []}
    if "server_pid" in record:
        _stop(int(record["server_pid"]))
    for agent in record["hosts"]:
        _stop(int(agent["pid"]))
    # What the agents still ran: a runtime on each state dir re-adopts it and kills it all.
    code = ("import asyncio, sys\n"
            "from pathlib import Path\n"
            "from pandastack.host.config import HostConfig\n"
            "from pandastack.host.runtime import HostRuntime\n"
            "async def main():\n"
            "    rt = HostRuntime(HostConfig.from_env(state_dir=Path(sys.argv[1])),"
            " progress=lambda m: None)\n"
            "    await rt.start(); await rt.kill_all(); await rt.close()\n"
            "asyncio.run(main())\n")
    for agent in record["hosts"]:
        if Path(agent["state_dir"]).exists():
            subprocess.run([sys.executable, "-c", code, agent["state_dir"]], cwd=ROOT,
                           check=False)
    shutil.rmtree(STATE, ignore_errors=True)
    shutil.rmtree(CLUSTER, ignore_errors=True)
    print("cluster down")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--port", type=int, default=8080)
    sub.add_parser("down")
    args = parser.parse_args()
    if args.command == "up":
        if not 1 <= args.hosts <= 16:
            parser.error("--hosts must be between 1 and 16")
        return up(args.hosts, args.port)
    return down()


if __name__ == "__main__":
    sys.exit(main())
