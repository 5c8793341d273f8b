"""`serve` over TLS (ADR 0048) with certificates made by the test (tests/tls_certs.py): the API
and the sandbox listener on a real uvicorn in a process of its own (tests/server/serve_fake.py
runs `serve_app`, as `pandastack serve` does), the API showing its certificate for 127.0.0.1
and the sandbox listener its wildcard one for `{port}-{id}.sandbox.test`. Both SDK twins
reach it with the test CA (`ca_bundle=`, PANDASTACK_CA_BUNDLE); without it the call fails at
once with a certificate error that says what to do, not a 500 and not a hang."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from pandastack.cli.main import main
from pandastack.sdk import AsyncClient, Client
from pandastack.sdk.errors import APIConnectionError, ConfigError
from tests.ports import free_port
from tests.server.live import fake_server
from tests.tls_certs import SANDBOX_DOMAIN, IssuedCerts, make_test_certs
from tests.tls_certs import peer_names as names_shown


@dataclass(frozen=True)
class TLSServer:
    url: str
    key: str
    port: int
    preview_port: int


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> IssuedCerts:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def server(certs: IssuedCerts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    tmp = tmp_path_factory.mktemp("serve")
    preview = free_port()
    with fake_server(tmp, verify=ssl.create_default_context(cafile=certs.ca),
                     preview_port=preview, preview_url=f"https://{SANDBOX_DOMAIN}:{preview}",
                     tls_cert=str(certs.server.cert), tls_key=str(certs.server.key),
                     sandbox_tls_cert=str(certs.wildcard.cert),
                     sandbox_tls_key=str(certs.wildcard.key)) as served:
        config = json.loads((tmp / "client" / "config.json").read_text())
        assert config["api_url"] == served.url  # what a first start writes says https
        port = urlsplit(served.url).port
        assert port is not None
        yield TLSServer(served.url, served.admin_key, port, preview)


@pytest.fixture
def no_sdk_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PANDASTACK_API", "PANDASTACK_API_KEY", "PANDASTACK_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def peer_names(port: int, server_name: str | None, ca: Path) -> list[str]:
    """The subjectAltName entries of the certificate the listener shows a client asking
    for `server_name` (None: no SNI, as a client dialing an address)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = server_name is not None
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        return names_shown(tls)


@pytest.mark.usefixtures("no_sdk_config")
async def test_both_sdk_twins_reach_the_api_with_the_test_ca(
        server: TLSServer, certs: IssuedCerts, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(server.url, server.key, ca_bundle=certs.ca) as client:
        assert client.sandboxes.list() == []
    async with AsyncClient(server.url, server.key, ca_bundle=str(certs.ca)) as aclient:
        assert await aclient.sandboxes.list() == []
    monkeypatch.setenv("PANDASTACK_CA_BUNDLE", str(certs.ca))
    with Client(server.url, server.key) as client:
        assert client.sandboxes.list() == []


@pytest.mark.usefixtures("no_sdk_config")
async def test_without_the_ca_the_sdk_says_the_certificate_is_not_trusted(
        server: TLSServer, certs: IssuedCerts) -> None:
    started = time.monotonic()
    for ca in (None, certs.other_ca):
        with Client(server.url, server.key, ca_bundle=ca, timeout=10) as client, \
                pytest.raises(APIConnectionError,
                              match=r"CERTIFICATE_VERIFY_FAILED.*PANDASTACK_CA_BUNDLE"):
            client.sandboxes.list()
        async with AsyncClient(server.url, server.key, ca_bundle=ca, timeout=10) as aclient:
            with pytest.raises(APIConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                await aclient.sandboxes.list()
    assert time.monotonic() - started < 8  # refused at the handshake, not timed out
    with pytest.raises(ConfigError, match="not a file"):
        Client(server.url, server.key, ca_bundle=certs.ca.parent / "nope.pem")


def test_plain_http_to_the_tls_port_gets_no_answer(server: TLSServer) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=10)


def test_the_sandbox_listener_shows_the_wildcard_certificate(
        server: TLSServer, certs: IssuedCerts) -> None:
    name = f"3000-sbx0000000000.{SANDBOX_DOMAIN}"
    assert peer_names(server.preview_port, name, certs.ca) == [f"*.{SANDBOX_DOMAIN}"]
    # The API's name (or none, dialing the address) gets the API's certificate.
    assert peer_names(server.port, "localhost", certs.ca) == ["127.0.0.1", "localhost"]
    assert peer_names(server.port, None, certs.ca) == ["127.0.0.1", "localhost"]
    # An HTTP request through it, verified against the wildcard name: the sandbox listener
    # answers (no such sandbox), not the API.
    verify = ssl.create_default_context(cafile=certs.ca)
    with httpx.Client(verify=verify, timeout=10) as http:
        r = http.get(f"https://127.0.0.1:{server.preview_port}/",
                     headers={"Host": f"{name}:{server.preview_port}"},
                     extensions={"sni_hostname": name})
    assert r.status_code == 404, r.text
    assert f"{{port}}-{{sandbox id}}.{SANDBOX_DOMAIN}" in r.json()["error"]["message"]


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed, unwrapped (the console wraps long lines)."""
    captured = capsys.readouterr()
    return "".join((captured.out + captured.err).split())


def test_serve_refuses_bad_certificate_settings_before_it_starts(
        certs: IssuedCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_HOME", str(tmp_path))
    missing = tmp_path / "missing.pem"
    port = str(free_port())
    assert main(["serve", "--port", port, "--tls-cert", str(missing),
                 "--tls-key", str(certs.server.key)]) == 1
    assert str(missing) in said(capsys)
    assert main(["serve", "--port", port, "--sandbox-tls-cert", str(certs.wildcard.cert),
                 "--sandbox-tls-key", str(certs.wildcard.key)]) == 1
    assert "tls_certandtls_keytoo" in said(capsys)
    assert main(["serve", "--port", port, "--tls-cert", str(certs.server.cert)]) == 1
    assert "givebothorneither" in said(capsys)
