"""A live `pandastack serve` in a subprocess: the way users meet the product."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.helpers import qemu_pids_under
from tests.leftovers import owned_tmpdir
from tests.ports import free_port
from tests.server.live import terminate, wait_healthy


@dataclass(frozen=True)
class LiveServer:
    api_url: str
    api_key: str
    state_dir: Path
    preview_port: int = 0  # the listener of sandbox ports on their own origin

    def e2b(self, key: str | None = None, **extra: Any) -> dict[str, Any]:
        """What an E2B SDK user sets (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY), as the
        SDK's keyword options: the API, the sandbox-port listener, a key."""
        return {"api_url": self.api_url, "api_key": key or self.api_key,
                "sandbox_url": f"http://127.0.0.1:{self.preview_port}", **extra}

    def preview(self, signed_url: str) -> tuple[str, dict[str, str]]:
        """A signed URL as this machine reaches it: the loopback listener, and the Host
        header naming the port's origin (`*.localhost` needs no DNS in a browser; httpx
        would ask the resolver)."""
        parts = urlsplit(signed_url)
        return (f"http://127.0.0.1:{parts.port}{parts.path}?{parts.query}",
                {"Host": parts.netloc})


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    with run_live_server() as server:
        yield server


@contextlib.contextmanager
def run_live_server(extra_env: dict[str, str] | None = None, *, serve_args: Sequence[str] = (),
                    verify: ssl.SSLContext | None = None,
                    preview_port: int | None = None) -> Iterator[LiveServer]:
    """A `pandastack serve` of its own (`extra_env`: operator settings a test needs at the
    server's start; `serve_args`: more flags), checked for leftovers when it stops. With
    `verify` (`--tls-cert` and `--tls-key` among the flags) it is reached over https."""
    tmp = owned_tmpdir("pse-")
    port = free_port()
    preview_port = free_port() if preview_port is None else preview_port
    env = {
        **os.environ,
        "PANDASTACK_STATE_DIR": str(tmp / "sandboxes"),
        "PANDASTACK_SNAPSHOTS_DIR": str(tmp / "snapshots"),
        "PANDASTACK_DB": f"sqlite:///{tmp / 'pandastack.db'}",
        "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
        # Build-step caching is tested on the host runtime; here no cache snapshot outlives
        # its build, so the no-leftovers check below stays exact.
        "PANDASTACK_BUILD_CACHE_ENTRIES": "0",
        "PANDASTACK_PREVIEW_PORT": str(preview_port),
        # The webhook test's receiver is on 127.0.0.1, which webhooks may not reach otherwise.
        "PANDASTACK_WEBHOOK_ALLOW_PRIVATE": "1",
        **(extra_env or {}),
    }
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port),
         *serve_args],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"{'http' if verify is None else 'https'}://127.0.0.1:{port}"
    try:
        # It may have to bake the template first.
        wait_healthy(url, proc, tmp / "server.log", 300, verify=verify)
        key = json.loads((tmp / "client.json").read_text())["api_key"]
        yield LiveServer(url, key, tmp / "sandboxes", preview_port)
    finally:
        terminate(proc, 30)
        log.close()
        leftovers = qemu_pids_under(tmp)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        left_dirs = list((tmp / "sandboxes").glob("sbx-*"))
        left_dirs += list((tmp / "snapshots").glob("*snap-*"))
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, f"VMs left running after the e2e session: {leftovers}"
        assert not left_dirs, f"sandbox directories left: {left_dirs}"
