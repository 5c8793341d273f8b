"""The control plane and an agent over TLS with certificates the operator issues (made here by
openssl, tests/tls_certs.py): the host app on a real uvicorn with the context `pandastack agent
--tls-cert --tls-key --tls-client-ca` builds (cli/agent.listener_tls), and HostClient verifying
it with the CA and presenting a client certificate. An agent with mutual TLS refuses a client
without a certificate, or with one another CA issued; a client without the CA refuses the
agent. Every refusal is HostUnavailable naming the agent, at once (no hang)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import uvicorn

from pandastack.cli.agent import endpoint_of, listener_tls, listening_socket
from pandastack.cli.main import main
from pandastack.cli.tls import TLSFilesError, fixed
from pandastack.host.api import create_host_app
from pandastack.hostport.errors import HostUnavailable
from pandastack.hostport.protocols import RuntimePort
from pandastack.server.hostclient import HostClient, agent_tls
from tests.host.api.fake_host import FakeHost
from tests.tls_certs import IssuedCerts, make_test_certs

TOKEN = "t0ken"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> IssuedCerts:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


def agent_args(certs: IssuedCerts, *, mutual: bool = True) -> argparse.Namespace:
    return argparse.Namespace(tls_cert=certs.server.cert, tls_key=certs.server.key,
                              tls_client_ca=certs.ca if mutual else None)


@contextlib.asynccontextmanager
async def tls_agent(args: argparse.Namespace) -> AsyncIterator[str]:
    """The host app over a FakeHost on uvicorn at 127.0.0.1 over TLS, as the agent serves it;
    yields the https:// endpoint the agent would register."""
    sock = listening_socket("127.0.0.1:0")
    listen = f"127.0.0.1:{sock.getsockname()[1]}"
    tls = listener_tls(args, listen)
    assert tls is not None
    host = FakeHost()
    host.add("sbx-1")
    app = create_host_app(cast(RuntimePort, host), TOKEN)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=1,
                                           ssl_context_factory=fixed(tls)))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield endpoint_of(listen, None, tls=True)
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_mutual_tls_round_trip(certs: IssuedCerts) -> None:
    async with tls_agent(agent_args(certs)) as url:
        assert url.startswith("https://127.0.0.1:")
        tls = agent_tls(certs.ca, certs.client.cert, certs.client.key)
        async with HostClient(url, TOKEN, tls=tls) as client:
            assert (await client.status()).sandboxes == 1
            assert [s.id for s in await client.list_sandboxes()] == ["sbx-1"]


@pytest.mark.parametrize("client_cert", ["none", "stranger"])
async def test_mutual_tls_refuses_a_client_without_a_cert_it_trusts(
        certs: IssuedCerts, client_cert: str) -> None:
    pair = {"none": None, "stranger": certs.stranger}[client_cert]
    tls = agent_tls(certs.ca, pair.cert if pair else None, pair.key if pair else None)
    async with tls_agent(agent_args(certs)) as url:
        client = HostClient(url, TOKEN, tls=tls)
        try:
            async with asyncio.timeout(15):
                with pytest.raises(HostUnavailable, match=f"host agent at {url}"):
                    await client.start()
        finally:
            await client.close()


async def test_a_client_without_the_agents_ca_refuses_the_agent(certs: IssuedCerts) -> None:
    async with tls_agent(agent_args(certs, mutual=False)) as url:
        # The system's CAs (no --agent-ca), and a CA that did not issue the agent's cert.
        for tls in (None, agent_tls(certs.other_ca)):
            client = HostClient(url, TOKEN, tls=tls)
            try:
                async with asyncio.timeout(15):
                    with pytest.raises(HostUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                        await client.start()
            finally:
                await client.close()
        # Server-only TLS: the CA is enough, no client certificate asked for.
        async with HostClient(url, TOKEN, tls=agent_tls(certs.ca)) as client:
            assert (await client.status()).sandboxes == 1


async def test_plain_http_to_a_tls_agent_gets_no_answer(certs: IssuedCerts) -> None:
    async with tls_agent(agent_args(certs)) as url:
        client = HostClient(url.replace("https://", "http://"), TOKEN)
        try:
            async with asyncio.timeout(15):
                with pytest.raises(HostUnavailable):
                    await client.start()
        finally:
            await client.close()


def test_listener_tls_checks_its_flags(certs: IssuedCerts, tmp_path: Path) -> None:
    assert listener_tls(argparse.Namespace(), "127.0.0.1:1") is None
    assert listener_tls(None, "unix:/x") is None
    ctx = listener_tls(agent_args(certs), "127.0.0.1:1")
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TLSFilesError, match="unix socket"):
        listener_tls(agent_args(certs), f"unix:{tmp_path / 's'}")
    with pytest.raises(TLSFilesError, match="go together"):
        listener_tls(argparse.Namespace(tls_cert=certs.server.cert, tls_key=None,
                                        tls_client_ca=None), "127.0.0.1:1")
    # A key that is not the certificate's.
    with pytest.raises(TLSFilesError, match=str(certs.server.cert)):
        listener_tls(argparse.Namespace(tls_cert=certs.server.cert, tls_key=certs.client.key,
                                        tls_client_ca=None), "127.0.0.1:1")
    assert endpoint_of("10.0.0.2:7000", None, tls=True) == "https://10.0.0.2:7000"
    assert endpoint_of("10.0.0.2:7000", None) == "http://10.0.0.2:7000"


def test_agent_command_stops_on_a_bad_certificate_before_it_starts(
        certs: IssuedCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PANDASTACK_STATE_DIR", str(tmp_path / "state"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    missing = tmp_path / "missing.pem"
    code = main(["agent", "--listen", f"127.0.0.1:{port}", "--token-file",
                 str(tmp_path / "token"), "--tls-cert", str(missing), "--tls-key",
                 str(certs.server.key)])
    assert code == 2
    assert str(missing) in capsys.readouterr().out
