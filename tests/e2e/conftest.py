"""A live `pandastack serve` in a subprocess: the way users meet the product."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers import qemu_pids_under


@dataclass(frozen=True)
class LiveServer:
    api_url: str
    api_key: str
    state_dir: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    tmp = Path(tempfile.mkdtemp(prefix="pse-", dir="/tmp"))
    port = _free_port()
    env = {
        **os.environ,
        "PANDASTACK_STATE_DIR": str(tmp / "sandboxes"),
        "PANDASTACK_SNAPSHOTS_DIR": str(tmp / "snapshots"),
        "PANDASTACK_DB": f"sqlite:///{tmp / 'pandastack.db'}",
        "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
    }
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # may have to bake the template first
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not come up:\n"
                                     + (tmp / "server.log").read_text()[-3000:])
            time.sleep(0.2)
        key = json.loads((tmp / "client.json").read_text())["api_key"]
        yield LiveServer(url, key, tmp / "sandboxes")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        leftovers = qemu_pids_under(tmp)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        left_dirs = list((tmp / "sandboxes").glob("sbx-*"))
        left_dirs += list((tmp / "snapshots").glob("*snap-*"))
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, f"VMs left running after the e2e session: {leftovers}"
        assert not left_dirs, f"sandbox directories left: {left_dirs}"
