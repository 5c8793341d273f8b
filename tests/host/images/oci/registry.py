"""Debian's docker-registry on a loopback port, run by the tests: plain, behind basic auth
(htpasswd, bcrypt), or behind the bearer-token service of tokens.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:port
    storage: Path

    def blob_file(self, digest: str) -> Path:
        hexdigest = digest.split(":")[1]
        return (self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexdigest[:2]
                / hexdigest / "data")


def _config(tmp: Path, port: int, auth: str) -> Path:
    config = tmp / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {tmp / "data"}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
{auth}""")
    return config


@contextlib.contextmanager
def run_registry(tmp: Path, auth: str = "") -> Iterator[Registry]:
    """Start a registry and yield once it listens (its log says so); stop it after."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(["docker-registry", "serve", str(_config(tmp, port, auth))],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    listening = threading.Event()
    log: list[str] = []

    def drain() -> None:  # read to the end, so the registry never blocks on a full pipe
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            if "listening on" in line:
                listening.set()
        listening.set()  # it exited

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not listening.wait(START_TIMEOUT_S) or proc.poll() is not None:
            raise RuntimeError("docker-registry did not start:\n" + "".join(log[-20:]))
        yield Registry(host=f"127.0.0.1:{port}", storage=tmp / "data")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)


def htpasswd_auth(tmp: Path, user: str, password: str) -> str:
    path = tmp / "htpasswd"
    line = subprocess.run(["htpasswd", "-Bbn", user, password], check=True,
                          capture_output=True, text=True).stdout.strip()
    path.write_text(line + "\n")
    return f"""auth:
  htpasswd:
    realm: pandastack-tests
    path: {path}
"""
