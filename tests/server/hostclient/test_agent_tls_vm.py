"""A real `pandastack agent --listen 127.0.0.1:PORT --tls-cert --tls-key --tls-client-ca`
process on a real microVM, driven by HostClient over mutual TLS (certificates made by openssl,
tests/tls_certs.py): a create, an exec, a file written and read back, and a terminal over
wss:// through the same client certificate; a client without a certificate is refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from pandastack.hostport.errors import HostUnavailable
from pandastack.hostport.pty import PtyExit
from pandastack.server.hostclient import HostClient, agent_tls
from tests.server.live import free_port
from tests.server.live_agent import START_TIMEOUT, LiveAgent, assert_nothing_left, stop_cleanly
from tests.tls_certs import IssuedCerts, make_test_certs

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


class TLSAgent(LiveAgent):
    def __init__(self, tmp: Path, certs: IssuedCerts) -> None:
        super().__init__(tmp)
        self.certs = certs
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "PANDASTACK_STATE_DIR": str(self.state_dir),
               "PANDASTACK_SNAPSHOTS_DIR": str(self.snapshots_dir),
               "PANDASTACK_VOLUMES_DIR": str(self.volumes_dir)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pandastack", "agent", "--listen",
                 f"127.0.0.1:{self.port}", "--token-file", str(self.token_file),
                 "--log-level", "warning", "--tls-cert", str(self.certs.server.cert),
                 "--tls-key", str(self.certs.server.key),
                 "--tls-client-ca", str(self.certs.ca)],
                cwd=Path(__file__).resolve().parents[3], env=env, stdout=log,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        verify = ssl.create_default_context(cafile=self.certs.ca)
        verify.load_cert_chain(self.certs.client.cert, self.certs.client.key)
        with httpx.Client(verify=verify, base_url=self.url) as client:
            while True:
                try:
                    headers = {"Authorization": f"Bearer {self.token}"}
                    if client.get("/v1/host", headers=headers, timeout=5).status_code == 200:
                        return
                except (httpx.TransportError, OSError):
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the agent did not come up:\n{self.log_tail()}")
                time.sleep(0.05)


@pytest.fixture(scope="module")
async def agent(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TLSAgent]:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root")
    tmp = Path(tempfile.mkdtemp(prefix="pat-", dir="/tmp"))
    a = TLSAgent(tmp, make_test_certs(tmp_path_factory.mktemp("certs")))
    try:
        a.start()
        yield a
        stop_cleanly(a)
    finally:
        try:
            await assert_nothing_left(a)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


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
