"""`pandastack serve --tls-cert --tls-key --sandbox-tls-cert --sandbox-tls-key` with its host
in-process, on a real microVM, with certificates made by openssl (tests/tls_certs.py): the
Python SDK creates a sandbox over https with PANDASTACK_CA_BUNDLE, runs a command, opens a
terminal over wss://, and reaches a port of the sandbox through the sandbox listener on its
own origin (`8000-{id}.sandbox.test`), which shows the wildcard certificate.

E2B's SDKs (Python `e2b` of the dev extras, JavaScript `e2b` of tests/e2e/e2b_clients), each
with one sandbox: through serve's TLS (HTTP/1.1, all uvicorn has), then through the nginx of
docs/tls.md in front of it, which they reach over HTTP/2 (ADR 0048, addendum). The CA
reaches them only as a user gives it (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS): without it they
fail at the handshake."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from pandastack import Sandbox
from tests.e2e.conftest import run_live_server
from tests.leftovers import owned_tmpdir
from tests.ports import free_port
from tests.server.live import ROOT, terminate
from tests.tls_certs import SANDBOX_DOMAIN, IssuedCerts, make_test_certs

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class TLSServe:
    url: str
    key: str
    certs: IssuedCerts
    preview: int  # the sandbox listener's port


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
        yield TLSServe(server.api_url, server.api_key, certs, preview)


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


# E2B's SDKs over TLS, then through nginx in front (HTTP/2).

GUIDE = ROOT / "docs" / "tls.md"
CLIENTS_DIR = Path(__file__).with_name("e2b_clients")
CLIENT_TIMEOUT = 600  # a bound on a hung SDK, never a pass/fail criterion
# The guide's lines for nginx reaching serve's own TLS (after each proxy_pass, made https).
UPSTREAM_TLS = ("proxy_ssl_verify on;", "proxy_ssl_trusted_certificate /etc/pandastack/tls/ca.pem;",
                "proxy_ssl_name api.example.com;", "proxy_ssl_session_reuse on;")


@dataclass(frozen=True)
class Front:
    """nginx in front of `served`: the E2B API and sandbox URLs, and its access log."""
    api_url: str
    sandbox_url: str
    log: Path
    work: Path  # the clients run here (its node_modules is E2B's JS SDK)


def guide_nginx_conf() -> str:
    section = GUIDE.read_text().split("\n## nginx in front", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```nginx\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, "the guide's nginx configuration and its upstream TLS lines"
    assert [line.strip() for line in blocks[1].splitlines()] == list(UPSTREAM_TLS)
    return str(blocks[0])


def front_conf(served: TLSServe, api_port: int, sandbox_port: int) -> str:
    """The guide's configuration as the test runs it: nginx listens on two loopback ports
    (the SDKs are given addresses, not names: no DNS here), with the test CA's server
    certificate for both (a client reaching an address sends no name, so a wildcard would
    not do); its upstreams are serve's TLS ports, verified by the guide's lines."""
    certs = served.certs
    conf = guide_nginx_conf()
    for port in (api_port, sandbox_port):
        conf = conf.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{port} ssl http2;", 1)
    api = urlsplit(served.url).port
    upstream = "\n".join(f"        {line}" for line in UPSTREAM_TLS)
    replaced = {
        "server 127.0.0.1:8080;": f"server 127.0.0.1:{api};",
        "server 127.0.0.1:8081;": f"server 127.0.0.1:{served.preview};",
        "proxy_pass http://pandastack_api;": f"proxy_pass https://pandastack_api;\n{upstream}",
        "proxy_pass http://pandastack_sandboxes;":
            f"proxy_pass https://pandastack_sandboxes;\n{upstream}",
        "/etc/pandastack/tls/api.pem": str(certs.server.cert),
        "/etc/pandastack/tls/api.key": str(certs.server.key),
        "/etc/pandastack/tls/wildcard.pem": str(certs.server.cert),
        "/etc/pandastack/tls/wildcard.key": str(certs.server.key),
        "/etc/pandastack/tls/ca.pem": str(certs.ca),
        "proxy_ssl_name api.example.com;": "proxy_ssl_name localhost;",  # the test's API cert
    }
    for old, new in replaced.items():
        assert old in conf, old
        conf = conf.replace(old, new)
    return conf


def wait_listening(proc: subprocess.Popen[bytes], ports: tuple[int, ...], log: Path) -> None:
    deadline = time.monotonic() + 30
    for port in ports:
        while True:  # bounded: until nginx listens, exits or the deadline passes
            assert proc.poll() is None, f"nginx exited: {log.read_text()[-2000:]}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"nginx not listening on {port}"
                time.sleep(0.05)


@pytest.fixture(scope="module")
def front(served: TLSServe) -> Iterator[Front]:
    nginx = shutil.which("nginx")
    if nginx is None:
        pytest.fail("nginx is needed (scripts/host-deps.sh installs it)")
    built = subprocess.run(["bash", str(ROOT / "scripts" / "e2b-sdks.sh"), "node"],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, f"scripts/e2b-sdks.sh failed:\n{built.stderr[-3000:]}"
    node_modules = built.stdout.strip().split("=", 1)[1]
    work = owned_tmpdir("pse2b-")
    # ESM resolves packages beside the script: the script runs beside the cached modules.
    (work / "node_modules").symlink_to(node_modules)
    for name in ("over_tls.py", "over_tls.mjs"):
        shutil.copy(CLIENTS_DIR / name, work / name)
    api_port, sandbox_port = free_port(), free_port()
    (work / "pandastack.conf").write_text(front_conf(served, api_port, sandbox_port))
    log, errors = work / "access.log", work / "error.log"
    (work / "nginx.conf").write_text(f"""daemon off;
pid {work}/nginx.pid;
error_log {errors};
events {{}}
http {{
    log_format calls '$server_port $server_protocol $status $request_method $uri';
    access_log {log} calls;
    include {work}/pandastack.conf;
}}
""")
    # Working in `work`, its workers too: a killed run's leftovers are found by that.
    proc = subprocess.Popen([nginx, "-p", f"{work}/", "-c", str(work / "nginx.conf"),
                             "-e", str(errors)], cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        wait_listening(proc, (api_port, sandbox_port), errors)
        yield Front(f"https://127.0.0.1:{api_port}", f"https://127.0.0.1:{sandbox_port}", log,
                    work)
    finally:
        terminate(proc, 10)
        shutil.rmtree(work, ignore_errors=True)


def run_client(argv: list[str], served: TLSServe, front: Front,
               ca: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A client script with only what a user sets: the E2B variables (serve's own TLS) and,
    in `ca`, the CA's variable."""
    env = {"PATH": os.environ["PATH"], "HOME": str(front.work), "E2B_API_KEY": served.key,
           "E2B_API_URL": served.url, "E2B_SANDBOX_URL": f"https://127.0.0.1:{served.preview}",
           **ca}
    return subprocess.run([*argv, front.api_url, front.sandbox_url], cwd=front.work, env=env,
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT)


def nginx_calls(log: Path, since: int) -> list[tuple[int, str, int, str, str]]:
    """(port, protocol, status, method, path) of each call nginx logged after byte `since`."""
    lines = log.read_bytes()[since:].decode().splitlines()
    return [(int(port), proto, int(status), method, path)
            for port, proto, status, method, path in (line.split(" ", 4) for line in lines)]


def check_ways(seen: dict[str, Any]) -> None:
    for way in ("direct", "proxy"):
        assert seen[way] == {"stdout": f"{way} 42\n", "exit": 0,
                             "read_sha256": seen["payload_sha256"]}, way
    assert seen["killed"] is True


@pytest.mark.parametrize("sdk", ["python", "js"])
def test_e2b_sdk_over_tls_then_http2_through_nginx(sdk: str, served: TLSServe,
                                                   front: Front) -> None:
    argv, ca_var = {"python": ([sys.executable, "over_tls.py"], "SSL_CERT_FILE"),
                    "js": (["node", "over_tls.mjs"], "NODE_EXTRA_CA_CERTS")}[sdk]
    # Without the CA: refused at the first call's handshake, before any sandbox is made.
    untrusted = run_client(argv, served, front, {})
    assert untrusted.returncode != 0
    assert re.search(r"UnknownIssuer|certificate", untrusted.stderr, re.IGNORECASE), \
        untrusted.stderr[-2000:]

    since = front.log.stat().st_size
    proc = run_client(argv, served, front, {ca_var: str(served.certs.ca)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    check_ways(json.loads(proc.stdout.strip().splitlines()[-1]))

    calls = nginx_calls(front.log, since)
    api, sandbox = (urlsplit(u).port for u in (front.api_url, front.sandbox_url))
    assert {port for port, *_ in calls} == {api, sandbox}, calls  # both ways went through
    assert all(status < 400 for _, _, status, _, _ in calls), calls
    # The Python SDK pins its file downloads to HTTP/1.1 (its transport's HTTP/2 stalls on
    # empty DATA frames, says its `http_version` option); every other call is HTTP/2.
    downloads = {(sandbox, "GET", "/files")} if sdk == "python" else set()
    assert {(port, method, path) for port, proto, _, method, path in calls
            if proto != "HTTP/2.0"} == downloads, calls
