"""The sync terminal's WebSocket over TLS (sdk/_tls_socket.py), against real TLS servers on
loopback with certificates made by openssl: many opens, each with messages both ways at
once (websockets' reader thread and the caller's writes on one connection), arrive whole and
in order; a server that completes TLS but never answers the upgrade gives the SDK's
connection error once the open timeout passes, and the SDK lets go of the socket (with
`ssl.SSLSocket` its reader thread stayed blocked in a read until the server closed)."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.server import ServerConnection, serve

from pandastack.sdk._http import HTTP
from pandastack.sdk.config import ClientConfig
from pandastack.sdk.errors import APIConnectionError
from pandastack.sdk.pty import _open
from tests.tls_certs import IssuedCerts, make_test_certs

MESSAGES = 300


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> IssuedCerts:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


def server_context(certs: IssuedCerts) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.server.cert, certs.server.key)
    return ctx


def http_to(port: int, ca: Path, connect_timeout: float = 10) -> HTTP:
    return HTTP(ClientConfig(api_url=f"https://127.0.0.1:{port}", api_key="k",
                             timeout=httpx.Timeout(30, connect=connect_timeout),
                             ca_bundle=str(ca)))


async def chatty(ws: ServerConnection) -> None:
    """Sends MESSAGES numbered messages while it reads the client's; then the count and
    the sum of what it read."""
    async def talk() -> None:
        for i in range(MESSAGES):
            await ws.send(f"s{i}")
    sender = asyncio.create_task(talk())
    got = [await ws.recv() for _ in range(MESSAGES)]
    await sender
    await ws.send(json.dumps({"n": len(got), "in_order": got == [f"c{i}" for i in
                                                                  range(MESSAGES)]}))


@pytest.fixture(scope="module")
def ws_server(certs: IssuedCerts) -> Iterator[int]:
    """An asyncio websockets server over TLS (one thread: its TLS is never entered twice)."""
    loop = asyncio.new_event_loop()
    ready: list[int] = []
    started = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        async with serve(chatty, "127.0.0.1", 0, ssl=server_context(certs)) as server:
            ready.append(next(iter(server.sockets)).getsockname()[1])
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(30)
    yield ready[0]
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)


@pytest.mark.timeout(120)
def test_opens_with_messages_both_ways_at_once_arrive_whole_and_in_order(
        ws_server: int, certs: IssuedCerts) -> None:
    http = http_to(ws_server, certs.ca)
    for _ in range(20):
        ws = _open(http, "sbx-x", 7)
        try:
            for i in range(MESSAGES):
                ws.send(f"c{i}")
            got = [ws.recv(timeout=30) for _ in range(MESSAGES + 1)]
        finally:
            ws.close()
        assert got[:MESSAGES] == [f"s{i}" for i in range(MESSAGES)]
        assert json.loads(got[-1]) == {"n": MESSAGES, "in_order": True}


@pytest.fixture
def silent_server(certs: IssuedCerts) -> Iterator[int]:
    """Completes the TLS handshake, reads the upgrade request and never answers: it holds
    the connection until the test ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    ctx = server_context(certs)
    done = threading.Event()
    held: list[ssl.SSLSocket] = []

    def run() -> None:
        conn, _ = listener.accept()
        tls = ctx.wrap_socket(conn, server_side=True)
        held.append(tls)
        tls.recv(65536)
        done.wait(60)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join(30)
    for tls in held:
        tls.close()
    listener.close()


@pytest.mark.timeout(30)
def test_an_upgrade_never_answered_is_a_connection_error_and_the_socket_is_let_go(
        silent_server: int, certs: IssuedCerts) -> None:
    http = http_to(silent_server, certs.ca, connect_timeout=1)
    with pytest.raises(APIConnectionError, match="pty 7 of sbx-x: TimeoutError"):
        _open(http, "sbx-x", 7)


def test_a_certificate_the_bundle_does_not_trust_is_refused(ws_server: int,
                                                            certs: IssuedCerts) -> None:
    http = http_to(ws_server, certs.other_ca)
    with pytest.raises(APIConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        _open(http, "sbx-x", 7)
