"""SIGKILL the server while sandboxes run, kill one sandbox's VM while the server is down, then
start the server again on the same DB and state dir: the survivor is adopted (listed as
running, exec works, its files are intact); the dead one is marked `failed` and nothing of it
is left on the host. Real `pandastack serve` processes, real VMs. Also here, because it needs
the real server process: a 1 GB JSON body is refused without growing that process's memory."""

from __future__ import annotations

import contextlib
import json
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

from tests.helpers import qemu_pids_under
from tests.server.live import free_port, wait_healthy

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


class ServeProcess:
    """`pandastack serve` on a private DB, state dir, volumes dir and client config under
    `tmp`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state_dir = tmp / "s"  # short: unix socket paths must stay under 108 bytes
        self.volumes_dir = tmp / "volumes"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        env = {
            **os.environ,
            "PANDASTACK_STATE_DIR": str(self.state_dir),
            "PANDASTACK_VOLUMES_DIR": str(self.volumes_dir),
            "PANDASTACK_DB": f"sqlite:///{self.tmp / 'pandastack.db'}",
            "PANDASTACK_CLIENT_CONFIG": str(self.tmp / "client.json"),
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(self.port)],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_healthy(self.url, self.proc, self.log_path, timeout)

    def api_key(self) -> str:
        key: str = json.loads((self.tmp / "client.json").read_text())["api_key"]
        return key

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def signal(self, sig: int, timeout: float = 30) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def started_serve(prefix: str) -> Iterator[ServeProcess]:
    """A started `ServeProcess` for a module's tests; on the way out it must stop on SIGTERM
    and leave no VM, sandbox directory or volume."""
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    server = ServeProcess(tmp)
    try:
        server.start(timeout=300)
        yield server
    finally:
        if server.proc is not None:
            server.signal(signal.SIGTERM)
        leftovers = qemu_pids_under(tmp)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        left_dirs = list(server.state_dir.glob("sbx-*"))
        left_volumes = list(server.volumes_dir.glob("vol-*"))
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, f"VMs left running: {leftovers}"
        assert not left_dirs, f"sandbox directories left: {left_dirs}"
        assert not left_volumes, f"volumes left: {left_volumes}"


def wait_gone(pid: int, timeout: float = 10) -> None:
    """Until the process has exited (a zombie whose parent died counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not exit")


@pytest.fixture
def serve() -> Iterator[ServeProcess]:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    tmp = Path(tempfile.mkdtemp(prefix="psr-", dir="/tmp"))
    server = ServeProcess(tmp)
    try:
        yield server
    finally:
        if server.proc is not None:
            server.signal(signal.SIGKILL)
        leftovers = qemu_pids_under(tmp)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def create(c: httpx.Client, role: str) -> str:
    r = c.post("/v1/sandboxes", json={"ttl_seconds": 600, "metadata": {"role": role}})
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "running"
    return str(r.json()["id"])


def test_sigkill_restart_adopts_survivors_and_fails_the_dead(serve: ServeProcess) -> None:
    started = time.monotonic()
    serve.start()
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        survivor, doomed = create(c, "survivor"), create(c, "doomed")
        r = c.put(f"/v1/sandboxes/{survivor}/files", params={"path": "/work/kept.txt"},
                  content=b"still here\n")
        assert r.status_code == 200, r.text
        r = c.post(f"/v1/sandboxes/{survivor}/exec", json={"cmd": "echo before > /work/b"})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

    serve.signal(signal.SIGKILL)  # no shutdown code runs: the VMs keep going
    survivor_pids = qemu_pids_under(serve.state_dir / survivor)
    doomed_pids = qemu_pids_under(serve.state_dir / doomed)
    assert len(survivor_pids) == 1 and len(doomed_pids) == 1, (survivor_pids, doomed_pids)
    os.kill(doomed_pids[0], signal.SIGKILL)  # dies while nobody is watching
    wait_gone(doomed_pids[0])
    assert (serve.state_dir / doomed).is_dir()  # its directory is still there, for now

    serve.start()  # same DB, same state dir, same port
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        listed = {s["id"]: s for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        assert listed[survivor]["state"] == "running", listed
        assert listed[doomed]["state"] == "failed", listed
        assert listed[doomed]["ended_at"] and listed[doomed]["end_reason"], listed[doomed]
        assert c.get("/v1/sandboxes", params={"metadata.role": "doomed"}).json()[
            "sandboxes"][0]["state"] == "failed"
        # the dead one is gone from the host, and answers as ended
        assert not (serve.state_dir / doomed).exists()
        assert not qemu_pids_under(serve.state_dir / doomed)
        r = c.post(f"/v1/sandboxes/{doomed}/exec", json={"cmd": "true"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text
        # the survivor works, with its files and the same VM process
        assert qemu_pids_under(serve.state_dir / survivor) == survivor_pids
        r = c.post(f"/v1/sandboxes/{survivor}/exec",
                   json={"cmd": "cat /work/kept.txt /work/b; echo $((6*7))"})
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "still here\nbefore\n42\n", r.json()
        r = c.get(f"/v1/sandboxes/{survivor}/files", params={"path": "/work/kept.txt"})
        assert r.status_code == 200 and r.content == b"still here\n"
        # tear down through the API
        assert c.delete(f"/v1/sandboxes/{survivor}").status_code == 204
        assert c.get(f"/v1/sandboxes/{survivor}").json()["state"] == "killed"

    serve.signal(signal.SIGTERM)
    assert not qemu_pids_under(serve.tmp), serve.log_tail()
    assert not list(serve.state_dir.glob("sbx-*"))
    assert "Traceback" not in serve.log_path.read_text(errors="replace"), serve.log_tail()
    assert time.monotonic() - started < 60


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_real_server_refuses_a_gigabyte_json_body(serve: ServeProcess) -> None:
    serve.start()
    assert serve.proc is not None
    headers = {"Authorization": f"Bearer {serve.api_key()}", "Content-Type": "application/json"}
    chunk = b" " * (1 << 20)

    def one_gb() -> Iterator[bytes]:
        for _ in range(1024):
            yield chunk

    httpx.get(f"{serve.url}/v1/sandboxes", headers=headers).raise_for_status()
    Path(f"/proc/{serve.proc.pid}/clear_refs").write_text("5")  # peak RSS := current RSS
    baseline = _status_kb(serve.proc.pid, "VmRSS")
    for extra in ({}, {"Content-Length": str(1 << 30)}):
        with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
            r = c.post("/v1/sandboxes", content=one_gb(), headers=extra)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "payload_too_large"
    assert _status_kb(serve.proc.pid, "VmHWM") - baseline < 50 << 10
    assert not list(serve.state_dir.glob("sbx-*"))  # nothing was created
    serve.signal(signal.SIGTERM)
