"""docs/tls.md's *Caddy in front*, run as written: the guide's Caddyfile (`api.example.com` and
`*.example.com` in front of a plain-HTTP `pandastack serve` on loopback, E2B_DOMAIN's layout),
changed only where a test machine must differ: the wildcard's certificate is one the test
makes with openssl (for `*.example.com` and `api.example.com`) instead of the DNS challenge's,
both names are served on a free loopback port instead of 443, and its upstreams are the test
server's ports.

No name resolves here (and a DNS query must not leave the machine), so the clients reach
Caddy through a CONNECT proxy on loopback that sends every `*.example.com` name to it, as a
wildcard record would: the clients still ask for the names (SNI, Host), the TLS is theirs end to
end. Through it, on one sandbox: our Python SDK at `https://api.example.com:PORT` (create,
a streamed command whose first line must arrive while it still runs, a port of the sandbox at
`{port}-{id}.example.com`), then E2B's Python SDK with only E2B_DOMAIN (a streamed command, a
file each way, kill)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from pandastack import Sandbox
from tests.e2e.conftest import LiveServer, run_live_server
from tests.leftovers import owned_tmpdir
from tests.ports import free_port
from tests.server.live import ROOT, terminate
from tests.threaded_server import pass_through
from tests.tls_certs import Pair, _ca, _issue

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(600)]

GUIDE = ROOT / "docs" / "tls.md"
CLIENT = Path(__file__).with_name("e2b_clients") / "over_caddy.py"
DOMAIN = "example.com"
CLIENT_TIMEOUT = 300  # a bound on a hung SDK, never a pass/fail criterion
WAIT = 180  # the same for a command's stream: generous, guests are slow on a loaded host
# What the test machine replaces: the DNS challenge (no DNS provider here, and Debian's caddy
# has no DNS modules) by the test's certificate.
DNS_CHALLENGE = "\ttls {\n\t\tdns cloudflare {env.CLOUDFLARE_API_TOKEN}\n\t}\n"


def guide_caddyfile() -> str:
    section = GUIDE.read_text().split("\n## Caddy in front", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "the guide's Caddyfile"
    return str(blocks[0])


def local_caddyfile(cert: Pair, port: int, api: int, preview: int) -> str:
    """The guide's Caddyfile as the test runs it; global options first: loopback only, both
    names on `port`, no ACME (the certificate is the test's), no admin endpoint."""
    conf = guide_caddyfile()
    replaced = {
        DNS_CHALLENGE: f"\ttls {cert.cert} {cert.key}\n",
        "reverse_proxy 127.0.0.1:8080": f"reverse_proxy 127.0.0.1:{api}",
        "reverse_proxy 127.0.0.1:8081 {": f"reverse_proxy 127.0.0.1:{preview} {{",
    }
    for old, new in replaced.items():
        assert conf.count(old) == 1, old
        conf = conf.replace(old, new)
    return (f"{{\n\tdefault_bind 127.0.0.1\n\thttps_port {port}\n\tauto_https off\n"
            f"\tadmin off\n}}\n{conf}")


class NameProxy:
    """An HTTP CONNECT proxy on loopback that takes the place of DNS: a tunnel to any name
    under the domain goes to Caddy's port on 127.0.0.1 (like a wildcard record), any other
    is refused. It sees only the names asked for (kept in `names`) and encrypted bytes."""

    def __init__(self, domain: str, port: int) -> None:
        self.names: list[str] = []
        self._name = re.compile(rf"[a-z0-9-]+\.{re.escape(domain)}:{port}")
        self._port = port
        tunnel = self._tunnel

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                tunnel(self.request)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> NameProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:  # bounded: the head's size, or the client's end
            data = client.recv(4096)
            if not data or len(head) > 16384:
                return
            head += data
        request, _, rest = head.partition(b"\r\n\r\n")
        method, target, _ = request.split(b"\r\n", 1)[0].decode().split(" ", 2)
        if method != "CONNECT" or not self._name.fullmatch(target):
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.names.append(target)
        with socket.create_connection(("127.0.0.1", self._port), timeout=10) as upstream:
            upstream.settimeout(None)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            upstream.sendall(rest)
            back = threading.Thread(target=pass_through, args=(upstream, client), daemon=True)
            back.start()
            pass_through(client, upstream)
            back.join()


@dataclass(frozen=True)
class Front:
    server: LiveServer
    port: int  # Caddy's, for both names
    ca: Path
    proxy: NameProxy
    work: Path


def start_caddy(caddy: str, work: Path) -> tuple[subprocess.Popen[bytes], list[str]]:
    """`caddy run` of the test's Caddyfile, once it serves (its log says so: an event, no
    polling); its log lines are kept."""
    # Its autosaved config and storage go to `work`, not root's home.
    env = {"PATH": os.environ["PATH"], "HOME": str(work), "XDG_DATA_HOME": str(work / "data"),
           "XDG_CONFIG_HOME": str(work / "config")}
    proc = subprocess.Popen([caddy, "run", "--config", str(work / "Caddyfile"), "--adapter",
                             "caddyfile"], cwd=work, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    serving = threading.Event()

    def read() -> None:  # until caddy exits: a pipe left unread would stop it
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append(raw.decode(errors="replace").rstrip())
            if '"serving initial configuration"' in lines[-1]:
                serving.set()
        serving.set()

    threading.Thread(target=read, daemon=True).start()
    serving.wait(timeout=60)
    if proc.poll() is not None or not any("serving initial configuration" in line
                                          for line in lines):
        terminate(proc, 10)
        pytest.fail("caddy did not start:\n" + "\n".join(lines[-30:]))
    return proc, lines


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.fail("caddy is needed (scripts/host-deps.sh installs it)")
    work = owned_tmpdir("pse2b-")
    try:
        ca = _ca(work, "ca")
        cert = _issue(work, "wildcard", ca, f"/CN=*.{DOMAIN}",
                      "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
                      f"subjectAltName=DNS:*.{DOMAIN},DNS:api.{DOMAIN}\n")
        port = free_port()
        # The guide's settings, with Caddy's port where the guide has 443.
        with run_live_server({"PANDASTACK_PUBLIC_URL": f"https://api.{DOMAIN}:{port}",
                              "PANDASTACK_PREVIEW_URL": f"https://{DOMAIN}:{port}"}) as server:
            api = urlsplit(server.api_url).port
            assert api is not None
            (work / "Caddyfile").write_text(
                local_caddyfile(cert, port, api, server.preview_port))
            proc, log = start_caddy(caddy, work)
            try:
                with NameProxy(DOMAIN, port) as proxy:
                    yield Front(server, port, ca[0], proxy, work)
            finally:
                terminate(proc, 10)
            assert proc.returncode == 0, "\n".join(log[-30:])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_sdks_through_caddy(front: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_CA_BUNDLE", str(front.ca))
    monkeypatch.setenv("HTTPS_PROXY", front.proxy.url)  # httpx's, as any user's proxy
    api_url = f"https://api.{DOMAIN}:{front.port}"
    sbx = Sandbox.create(ttl_seconds=300, api_url=api_url, api_key=front.server.api_key)
    try:
        # The command cannot end before it reads the line sent once its first came: a
        # stream held back until the response ends would hang here (until WAIT).
        proc = sbx.commands.start("echo first; read word; echo then $word")
        chunks: list[str] = []
        for event in proc.stream(timeout_seconds=WAIT):
            if event.type == "stdout":
                if not chunks:
                    proc.send_stdin("go\n")
                chunks.append(event.data)
            elif event.type == "exit":
                assert event.result is not None and event.result.exit_code == 0
        assert chunks[0] == "first\n" and "".join(chunks) == "first\nthen go\n"

        sbx.filesystem.write("/tmp/index.html", "<p>hi</p>")
        server = sbx.commands.start(["python3", "-u", "-m", "http.server", "8000"], cwd="/tmp")
        listening = next((event for event in server.stream(timeout_seconds=WAIT)
                          if "Serving HTTP" in event.data or event.type == "exit"), None)
        assert listening is not None and listening.type == "stdout", listening
        signed = urlsplit(sbx.signed_url(8000, ttl_seconds=60))
        assert signed.netloc == f"8000-{sbx.id}.{DOMAIN}:{front.port}"
        verify = ssl.create_default_context(cafile=front.ca)
        with httpx.Client(verify=verify, proxy=front.proxy.url, timeout=30) as http:
            page = http.get(f"https://{signed.netloc}/index.html?{signed.query}")
            assert page.status_code == 200 and page.text == "<p>hi</p>", page.text
            # the guide: a name of the wildcard that is no sandbox's port is the listener's 404
            assert http.get(f"https://www.{DOMAIN}:{front.port}/").status_code == 404

        e2b = run_e2b_client(front, sbx.id)
        assert e2b.returncode == 0, (e2b.stdout + e2b.stderr)[-3000:]
        seen = json.loads(e2b.stdout.strip().splitlines()[-1])
        assert seen["streamed"] == {"first": "first\n", "stdout": "first\nthen go\n",
                                    "exit": 0}
        assert seen["read_sha256"] == seen["payload_sha256"]
        assert seen["killed"] is True
        assert sbx.id not in [s.id for s in Sandbox.list(api_url=api_url,
                                                          api_key=front.server.api_key)]
    finally:
        sbx.kill()
    names = set(front.proxy.names)
    assert {f"api.{DOMAIN}:{front.port}", f"8000-{sbx.id}.{DOMAIN}:{front.port}",
            f"49983-{sbx.id}.{DOMAIN}:{front.port}"} <= names, names


def run_e2b_client(front: Front, sandbox_id: str) -> subprocess.CompletedProcess[str]:
    """E2B's Python SDK in a process of its own, with what a user sets: E2B_DOMAIN (with
    Caddy's port), the key, the CA (SSL_CERT_FILE); the name proxy as its `proxy`."""
    env = {"PATH": os.environ["PATH"], "HOME": str(front.work),
           "E2B_DOMAIN": f"{DOMAIN}:{front.port}", "E2B_API_KEY": front.server.api_key,
           "SSL_CERT_FILE": str(front.ca)}
    return subprocess.run([sys.executable, str(CLIENT), sandbox_id, front.proxy.url],
                          cwd=front.work, env=env, capture_output=True, text=True,
                          timeout=CLIENT_TIMEOUT)
