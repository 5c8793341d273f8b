"""A cluster on this machine for benchmarks: a private PostgreSQL (scripts/pg-cluster), a
private S3 server (scripts/s3-server), `pandastack agent`s registered in the one and sharing
the other (each with its own state and snapshot dirs, on a unix socket, one token), and the
control plane's `ClusterPool` over them (what `serve --no-local-agent` drives). Everything
is stopped and removed on the way out; a VM left under a private dir is killed."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from common import stop
from pandastack.server.hostclient import HostClient
from pandastack.server.hosts.cluster import ClusterPool
from pandastack.server.store import Store, open_store

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 300.0


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    pg = Path(tempfile.mkdtemp(prefix="pandastack-bench-pg-", dir="/tmp"))  # stop removes it
    try:
        yield subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "start", str(pg)],
                             check=True, timeout=180, capture_output=True,
                             text=True).stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "stop", str(pg)], check=False,
                       timeout=120)


@contextlib.contextmanager
def s3() -> Iterator[dict[str, str]]:
    """The S3 server's environment (PANDASTACK_S3_ENDPOINT, ..._BUCKET, keys)."""
    directory = Path(tempfile.mkdtemp(prefix="pandastack-bench-s3-", dir="/tmp"))
    try:
        out = subprocess.run([str(ROOT / "scripts" / "s3-server"), "start", str(directory)],
                             check=True, timeout=300, capture_output=True, text=True).stdout
        env = {}
        for text in out.splitlines():
            if text.startswith("export "):
                name, _, value = text.removeprefix("export ").partition("=")
                env[name] = shlex.split(value)[0] if value else ""
        yield env
    finally:
        subprocess.run([str(ROOT / "scripts" / "s3-server"), "stop", str(directory)],
                       check=False, timeout=120)


@dataclass
class Agent:
    tmp: Path
    proc: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"unix:{(self.tmp / 'agent.sock').resolve()}"


@contextlib.contextmanager
def agent(dsn: str, store_url: str, token: str, s3_env: dict[str, str]) -> Iterator[Agent]:
    tmp = Path(tempfile.mkdtemp(prefix="pbc-", dir="/tmp"))  # short: socket paths
    token_file = tmp / "agent.token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    env = {**os.environ, "PANDASTACK_STATE_DIR": str(tmp / "s"),
           "PANDASTACK_SNAPSHOTS_DIR": str(tmp / "snap"),
           "PANDASTACK_S3_ACCESS_KEY": s3_env["PANDASTACK_S3_ACCESS_KEY"],
           "PANDASTACK_S3_SECRET_KEY": s3_env["PANDASTACK_S3_SECRET_KEY"]}
    with open(tmp / "agent.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pandastack", "agent", "--listen", f"unix:{tmp / 'agent.sock'}",
             "--token-file", str(token_file), "--log-level", "warning", "--db", dsn,
             "--object-store", store_url], cwd=ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        transport = httpx.HTTPTransport(uds=str(tmp / "agent.sock"))
        with httpx.Client(transport=transport, base_url="http://agent") as probe:
            while True:
                with contextlib.suppress(httpx.TransportError, OSError):
                    if probe.get("/v1/host", headers={"Authorization": f"Bearer {token}"},
                                 timeout=2).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("agent did not come up:\n"
                                       + (tmp / "agent.log").read_text()[-3000:])
                time.sleep(0.1)
        yield Agent(tmp, proc)
    finally:
        stop(proc, tmp)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


@dataclass
class Cluster:
    store: Store
    pool: ClusterPool
    host_ids: list[str]


@contextlib.asynccontextmanager
async def cluster(hosts: int = 2) -> AsyncIterator[Cluster]:
    """`hosts` agents with PostgreSQL and S3, and a started pool over them; the host ids in
    the agents' order."""
    token = secrets.token_urlsafe(32)
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(postgres())
        s3_env = stack.enter_context(s3())
        url = (f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/bench"
               f"?endpoint={s3_env['PANDASTACK_S3_ENDPOINT']}")
        agents = [stack.enter_context(agent(dsn, url, token, s3_env)) for _ in range(hosts)]
        store = open_store(dsn)
        stack.callback(store.close)
        by_endpoint = {h.endpoint: h.id for h in store.list_hosts()}
        pool = ClusterPool(store, lambda endpoint: HostClient(endpoint, token))
        await pool.start()
        try:
            yield Cluster(store, pool, [by_endpoint[a.endpoint] for a in agents])
        finally:
            await pool.close()
