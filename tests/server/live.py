"""A real `uvicorn` server in a subprocess over the in-memory runtime (see serve_fake.py)."""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class FakeServer:
    url: str
    admin_key: str
    pid: int
    log: Path
    preview_port: int = 0  # its preview listener (sandbox ports on their own origin)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}

    def log_tail(self, limit: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-limit:]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float, *,
                 verify: ssl.SSLContext | None = None, sni_hostname: str | None = None) -> None:
    """Until `url`/health answers 200 (`verify`: the CA an https server's certificate is
    checked against; `sni_hostname`: the name asked for where the certificate has no
    127.0.0.1); the log's tail if `proc` ends or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    extensions = {} if sni_hostname is None else {"sni_hostname": sni_hostname}
    with httpx.Client(verify=True if verify is None else verify, timeout=2) as http:
        while True:
            try:
                if http.get(f"{url}/health", extensions=extensions).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not come up:\n"
                                     + log.read_text(errors="replace")[-3000:])
            time.sleep(0.05)


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, and SIGKILL if it is still there after `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def fake_server(tmp: Path, *, module: str = "tests.server.serve_fake",
                verify: ssl.SSLContext | None = None, sni_hostname: str | None = None,
                **settings: object) -> Iterator[FakeServer]:
    """Start it (`python -m MODULE PORT DIR SETTINGS_JSON`), wait for /health, yield;
    SIGTERM (then SIGKILL) on the way out. With `verify` (settings with tls_cert/tls_key)
    it is reached over https, as `wait_healthy` says."""
    port = free_port()
    settings = {"preview_port": free_port(), **settings}
    log = tmp / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(port), str(tmp), json.dumps(settings)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"{'http' if verify is None else 'https'}://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, 30, verify=verify, sni_hostname=sni_hostname)
        key = json.loads((tmp / "client" / "config.json").read_text())["api_key"]
        yield FakeServer(url, key, proc.pid, log, int(settings["preview_port"]))  # type: ignore[call-overload]
    finally:
        terminate(proc, 10)
