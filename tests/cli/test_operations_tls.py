"""docs/tls.md, *Certificates from your own CA*: the certificate block runs as written, and
what it makes serves: the API with `api.example.com`'s certificate, the sandbox listener with
the wildcard `*.sandboxes.example.com` chosen by name, and an agent with `agent-10.0.0.11`'s
under mutual TLS, which takes the control plane's client certificate and refuses a client
without one. The names are reached at 127.0.0.1 by asking for them (SNI and the hostname
check), as DNS would send a client there."""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pandastack.cli.agent import with_peer_tls
from pandastack.host.config import HostConfig, PeerCerts
from tests.ports import free_port
from tests.server.hostclient.test_agent_tls import TOKEN, tls_agent
from tests.server.live import ROOT, fake_server
from tests.tls_certs import peer_names

GUIDE = ROOT / "docs" / "tls.md"


def certificate_block() -> str:
    section = GUIDE.read_text().split("\n## Certificates from your own CA\n", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("guide-certs")
    subprocess.run(["bash", "-euo", "pipefail", "-c", certificate_block()], cwd=root,
                   check=True, capture_output=True, timeout=120)
    return root


def handshake(port: int, name: str, ca: Path, client: tuple[Path, Path] | None = None,
              request: bytes | None = None) -> tuple[list[str], bytes]:
    """The certificate's names shown to a client asking for `name` (verified against `ca`
    and `name`), and the answer's first line to `request`."""
    ctx = ssl.create_default_context(cafile=ca)
    if client is not None:
        ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=name) as tls:
        names = peer_names(tls)
        answer = b""
        if request is not None:
            tls.sendall(request)
            answer = tls.recv(200).split(b"\r\n", 1)[0]
    return names, answer


@pytest.fixture(scope="module")
def served(made: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    preview = free_port()
    with fake_server(tmp_path_factory.mktemp("serve"),
                     verify=ssl.create_default_context(cafile=made / "ca.pem"),
                     sni_hostname="api.example.com", preview_port=preview,
                     preview_url=f"https://sandboxes.example.com:{preview}",
                     tls_cert=str(made / "api.pem"), tls_key=str(made / "api.key"),
                     sandbox_tls_cert=str(made / "sandboxes.pem"),
                     sandbox_tls_key=str(made / "sandboxes.key")) as server:
        port = urlsplit(server.url).port
        assert port is not None
        yield port, preview


def test_the_guides_certificates_serve_the_api_and_the_sandbox_listener(
        made: Path, served: tuple[int, int]) -> None:
    port, preview = served
    ca = made / "ca.pem"
    assert handshake(port, "api.example.com", ca)[0] == ["api.example.com"]
    sandbox = "3000-sbx0000000000.sandboxes.example.com"
    names, answer = handshake(preview, sandbox, ca, request=(
        f"GET / HTTP/1.1\r\nHost: {sandbox}:{preview}\r\nConnection: close\r\n\r\n").encode())
    assert names == ["*.sandboxes.example.com"]
    assert answer == b"HTTP/1.1 404 Not Found"  # the listener's: no such sandbox


async def test_the_guides_agent_certificate_under_mutual_tls(made: Path) -> None:
    args = argparse.Namespace(tls_cert=made / "agent-10.0.0.11.pem",
                              tls_key=made / "agent-10.0.0.11.key",
                              tls_client_ca=made / "ca.pem")
    client = (made / "control-plane.pem", made / "control-plane.key")
    request = (f"GET /v1/host HTTP/1.1\r\nHost: 10.0.0.11\r\nAuthorization: Bearer {TOKEN}\r\n"
               "Connection: close\r\n\r\n").encode()
    async with tls_agent(args) as url:
        port = int(url.rsplit(":", 1)[1])
        names, answer = await asyncio.to_thread(handshake, port, "10.0.0.11", made / "ca.pem",
                                                client, request)
        assert names == ["10.0.0.11"] and answer == b"HTTP/1.1 200 OK"
        # TLS 1.3: the refusal of a missing client certificate arrives after the client's
        # handshake, as an alert or the connection closed on the first read; no answer.
        try:
            _names, answer = await asyncio.to_thread(handshake, port, "10.0.0.11",
                                                     made / "ca.pem", None, request)
        except (ssl.SSLError, ConnectionError):
            answer = b""
        assert answer == b""


def test_the_guides_agent_certificate_serves_the_streams_between_agents(made: Path) -> None:
    """Shown to other agents as a client's too (a migration's or fork's stream): the
    agent's start check passes it (one for servers only stops the agent)."""
    args = argparse.Namespace(tls_cert=made / "agent-10.0.0.11.pem",
                              tls_key=made / "agent-10.0.0.11.key",
                              tls_client_ca=made / "ca.pem")
    assert with_peer_tls(HostConfig(), args).peer_tls == PeerCerts(
        args.tls_cert, args.tls_key, args.tls_client_ca)
