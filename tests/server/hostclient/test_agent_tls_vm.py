"""A real `pandastack agent --listen 127.0.0.1:PORT --tls-cert --tls-key --tls-client-ca`
process on a real microVM, driven by HostClient over mutual TLS (certificates made by openssl,
tests/tls_certs.py): a create, an exec, a file written and read back, and a terminal over
wss:// through the same client certificate; a client without a certificate is refused."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from pandastack.hostport.errors import HostUnavailable
from pandastack.hostport.pty import PtyExit
from pandastack.server.hostclient import HostClient, agent_tls
from tests.leftovers import owned_tmpdir
from tests.ports import free_port
from tests.server.live_agent import LiveAgent, started
from tests.tls_certs import IssuedCerts, make_test_certs

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


class TLSAgent(LiveAgent):
    """On 127.0.0.1 over mutual TLS: the server certificate, clients the test CA issued."""

    def __init__(self, tmp: Path, certs: IssuedCerts) -> None:
        super().__init__(tmp)
        self.certs = certs
        port = free_port()
        self.listen = f"127.0.0.1:{port}"
        self.url = f"https://127.0.0.1:{port}"
        self.extra_args = ["--tls-cert", str(certs.server.cert),
                           "--tls-key", str(certs.server.key), "--tls-client-ca", str(certs.ca)]

    def probe_client(self) -> httpx.Client:
        verify = ssl.create_default_context(cafile=self.certs.ca)
        verify.load_cert_chain(self.certs.client.cert, self.certs.client.key)
        return httpx.Client(verify=verify, base_url=self.url)


@pytest.fixture(scope="module")
async def agent(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TLSAgent]:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    certs = make_test_certs(tmp_path_factory.mktemp("certs"))
    tmp = owned_tmpdir("pat-")
    async with started(TLSAgent(tmp, certs)) as a:
        yield a


async def test_a_sandbox_through_an_agent_over_mutual_tls(agent: TLSAgent) -> None:
    certs = agent.certs
    tls = agent_tls(certs.ca, certs.client.cert, certs.client.key)
    async with HostClient(agent.url, agent.token, tls=tls) as client:
        sbx = await client.create("base")
        try:
            r = await sbx.exec("echo over-tls")
            assert (r.exit_code, r.stdout) == (0, b"over-tls\n")
            await sbx.write_file("/tmp/f", b"x" * 300_000)
            got = b"".join([chunk async for chunk in sbx.read_file("/tmp/f")])
            assert got == b"x" * 300_000
            pid = await sbx.pty_create(cols=80, rows=24, cmd=["/bin/sh"])
            term = await sbx.pty_connect(pid)  # wss:// with the same context
            await term.send(b"echo T$((6*7)); exit 3\n")
            seen = b""
            async with asyncio.timeout(60):
                while not isinstance(item := await term.receive(), PtyExit):
                    seen += item
            assert b"T42" in seen and item.exit_code == 3
            await term.close()
        finally:
            await client.kill(sbx.id)
    stranger = HostClient(agent.url, agent.token, tls=agent_tls(certs.ca))
    try:
        with pytest.raises(HostUnavailable):
            await stranger.start()
    finally:
        await stranger.close()
