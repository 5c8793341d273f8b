"""Debian's docker-registry on a loopback port, run by the tests: plain, behind basic auth
(htpasswd, bcrypt), or behind the bearer-token service of tokens.py."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:port
    storage: Path

    def blob_file(self, digest: str) -> Path:
        hexdigest = digest.split(":")[1]
        return (self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexdigest[:2]
                / hexdigest / "data")


def _config(tmp: Path, port: int, auth: str, tls: tuple[Path, Path] | None) -> Path:
    config = tmp / "config.yml"
    serving = "" if tls is None else (f"  tls:\n    certificate: {tls[0]}\n"
                                      f"    key: {tls[1]}\n")
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
{serving}{auth}""")
    return config


START_ATTEMPTS = 3  # the free port may be taken again before the registry binds it


class _Running:
    """A registry process whose log is read to the end (so it never blocks on a full
    pipe); `listening` is set when it says so or exits."""

    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.listening = threading.Event()
        self.started = False
        self.log: list[str] = []
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if "listening on" in line:
                self.started = True
                self.listening.set()
        self.listening.set()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)


@contextlib.contextmanager
def run_registry(tmp: Path, auth: str = "", *,
                 tls: tuple[Path, Path] | None = None) -> Iterator[Registry]:
    """Start a registry and yield once it listens (its log says so); stop it after. `tls`:
    its certificate and key, served over HTTPS then."""
    tmp.mkdir(parents=True, exist_ok=True)
    for _ in range(START_ATTEMPTS):
        port = free_port()
        running = _Running(_config(tmp, port, auth, tls))
        running.listening.wait(START_TIMEOUT_S)
        if running.started:
            break
        running.stop()
    else:
        raise RuntimeError("docker-registry did not start:\n" + "".join(running.log[-20:]))
    try:
        yield Registry(host=f"127.0.0.1:{port}", storage=tmp / "data")
    finally:
        running.stop()


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
