"""`pandastack serve --tls-cert --tls-key --sandbox-tls-cert --sandbox-tls-key` with its host
in-process, on a real microVM, with certificates made by openssl (tests/tls_certs.py): the
Python SDK creates a sandbox over https with PANDASTACK_CA_BUNDLE, runs a command, opens a
terminal over wss://, and reaches a port of the sandbox through the sandbox listener on its
own origin (`8000-{id}.sandbox.test`), which shows the wildcard certificate."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from pandastack import Sandbox
from tests.helpers import qemu_pids_under
from tests.server.live import free_port, terminate
from tests.tls_certs import SANDBOX_DOMAIN, IssuedCerts, make_test_certs

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class TLSServe:
    url: str
    key: str
    certs: IssuedCerts


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServe]:
    certs = make_test_certs(tmp_path_factory.mktemp("certs"))
    tmp = Path(tempfile.mkdtemp(prefix="pst-", dir="/tmp"))
    port, preview = free_port(), free_port()
    env = {**os.environ, "PANDASTACK_STATE_DIR": str(tmp / "sandboxes"),
           "PANDASTACK_SNAPSHOTS_DIR": str(tmp / "snapshots"),
           "PANDASTACK_DB": f"sqlite:///{tmp / 'pandastack.db'}",
           "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
           "PANDASTACK_BUILD_CACHE_ENTRIES": "0",
           "PANDASTACK_PREVIEW_PORT": str(preview),
           "PANDASTACK_PREVIEW_URL": f"https://{SANDBOX_DOMAIN}:{preview}"}
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port),
         "--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key),
         "--sandbox-tls-cert", str(certs.wildcard.cert),
         "--sandbox-tls-key", str(certs.wildcard.key)],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        verify = ssl.create_default_context(cafile=certs.ca)
        deadline = time.monotonic() + 300  # may have to bake the template first
        while True:
            try:
                if httpx.get(f"{url}/health", verify=verify, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((tmp / "server.log").read_text(errors="replace")[-3000:])
            time.sleep(0.1)
        config = json.loads((tmp / "client.json").read_text())
        assert config["api_url"] == url
        yield TLSServe(url, config["api_key"], certs)
    finally:
        terminate(proc, 30)
        log.close()
        leftovers = qemu_pids_under(tmp)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        left_dirs = list((tmp / "sandboxes").glob("sbx-*"))
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers and not left_dirs, (leftovers, left_dirs)


def test_sdk_terminal_and_sandbox_port_over_tls(served: TLSServe,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_CA_BUNDLE", str(served.certs.ca))
    with Sandbox.create(ttl_seconds=300, api_url=served.url, api_key=served.key) as sbx:
        assert sbx.commands.run("echo over-tls").stdout == "over-tls\n"
        seen = bytearray()
        term = sbx.pty.create(cols=80, rows=24, cmd=["/bin/sh"], on_data=seen.extend)
        term.send_stdin("echo T$((6*7)); exit 5\n")
        assert term.wait(timeout=60) == 5
        assert b"T42" in seen

        sbx.filesystem.write("/tmp/index.html", "<p>hi</p>")
        sbx.commands.start(["python3", "-m", "http.server", "8000"], cwd="/tmp")
        signed = sbx.signed_url(8000, ttl_seconds=60)
        parts = urlsplit(signed)
        assert parts.scheme == "https" and parts.hostname == f"8000-{sbx.id}.{SANDBOX_DOMAIN}"
        verify = ssl.create_default_context(cafile=served.certs.ca)
        with httpx.Client(verify=verify, timeout=10) as http:
            deadline = time.monotonic() + 30
            while True:  # bounded wait for the server in the sandbox to listen
                # DNS would send the wildcard name here; the client asks for it (SNI and
                # the certificate's name check) and says it in Host.
                r = http.get(f"https://127.0.0.1:{parts.port}/index.html?{parts.query}",
                             headers={"Host": parts.netloc},
                             extensions={"sni_hostname": parts.hostname})
                if r.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert r.status_code == 200 and r.text == "<p>hi</p>"
