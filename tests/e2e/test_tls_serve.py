"""`pandastack serve --tls-cert --tls-key --sandbox-tls-cert --sandbox-tls-key` with its host
in-process, on a real microVM, with certificates made by openssl (tests/tls_certs.py): the
Python SDK creates a sandbox over https with PANDASTACK_CA_BUNDLE, runs a command, opens a
terminal over wss://, and reaches a port of the sandbox through the sandbox listener on its
own origin (`8000-{id}.sandbox.test`), which shows the wildcard certificate."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

from pandastack import Sandbox
from tests.e2e.conftest import run_live_server
from tests.server.live import free_port
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
    preview = free_port()
    with run_live_server(
            {"PANDASTACK_PREVIEW_URL": f"https://{SANDBOX_DOMAIN}:{preview}"},
            serve_args=["--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key),
                        "--sandbox-tls-cert", str(certs.wildcard.cert),
                        "--sandbox-tls-key", str(certs.wildcard.key)],
            verify=ssl.create_default_context(cafile=certs.ca), preview_port=preview) as server:
        config = json.loads((server.state_dir.parent / "client.json").read_text())
        assert config["api_url"] == server.api_url
        yield TLSServe(server.api_url, server.api_key, certs)


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
