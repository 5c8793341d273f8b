"""The one-shot channel between agents (host/runtime/channel.py) with certificates the test
made with openssl (tests/tls_certs.py): mutual TLS by the operator's CA with the token inside
it, the relay a VMM's stream goes through, the tickets' TLS agreement. No VM: the migration
and fork streams over it on real VMs are test_runtime_streams_tls.py."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.cli.agent import with_peer_tls
from pandastack.host.config import HostConfig, PeerCerts
from pandastack.host.runtime import channel
from pandastack.host.runtime.channel import PeerTLS, Relay
from pandastack.hostport.errors import SetupError, VMMError
from tests.tls_certs import IssuedCerts, Pair, make_test_certs

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> IssuedCerts:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls(certs: IssuedCerts) -> PeerTLS:
    """An agent's (both ends here are agents of one operator: the same files do)."""
    return PeerTLS(PeerCerts(certs.server.cert, certs.server.key, certs.ca))


class Listening:
    def __init__(self, tls: PeerTLS | None) -> None:
        self.listener = channel.listen("127.0.0.1")
        self.port: int = self.listener.getsockname()[1]
        self.token = secrets.token_bytes(channel.TOKEN_BYTES)
        self.accepting = asyncio.ensure_future(
            channel.accept(self.listener, self.token, tls, within_s=30))


@pytest.fixture
async def listening(tls: PeerTLS) -> AsyncIterator[Listening]:
    chan = Listening(tls)
    yield chan
    chan.accepting.cancel()
    chan.listener.close()


def _knock(port: int, token: bytes, ca: Path, cert: Pair | None) -> bytes:
    """What the listener answers a TLS client showing `cert` (None: no certificate) and
    `token`: b"" where it closed the connection, b"refused: ..." where the handshake or the
    first read failed (TLS 1.3 judges a client's certificate after the client's handshake)."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(token)
            return conn.recv(1)
    except OSError as exc:
        return f"refused: {exc}".encode()


async def test_only_a_source_with_the_operators_certificate_and_the_token_gets_in(
        listening: Listening, tls: PeerTLS, certs: IssuedCerts) -> None:
    port, token = listening.port, listening.token
    # Refused at the handshake: an alert, or the connection closed on the first read.
    for cert in (None, certs.stranger):
        answer = await asyncio.to_thread(_knock, port, token, certs.ca, cert)
        assert answer.startswith(b"refused"), answer
    wrong_token = secrets.token_bytes(channel.TOKEN_BYTES)
    assert await asyncio.to_thread(_knock, port, wrong_token, certs.ca, certs.server) == b""
    assert not listening.accepting.done()

    sent = await asyncio.to_thread(channel.connect, "127.0.0.1", port, token, tls)
    got = await listening.accepting
    try:
        assert isinstance(sent, ssl.SSLSocket) and isinstance(got, ssl.SSLSocket)
        peer = got.getpeercert()
        assert peer is not None and ("commonName", "localhost") in peer["subject"][0]
        await asyncio.to_thread(sent.sendall, b"after the token")
        assert await asyncio.to_thread(got.recv, 64) == b"after the token"
    finally:
        sent.close()
        got.close()


async def test_after_eight_strangers_the_listener_stops(listening: Listening,
                                                        certs: IssuedCerts) -> None:
    for _ in range(channel.MAX_STRANGERS + 1):
        await asyncio.to_thread(_knock, listening.port, listening.token, certs.ca, None)
    with pytest.raises(VMMError, match="did not"):
        await listening.accepting


async def test_a_destination_not_named_by_its_certificate_is_not_told_the_token(
        tls: PeerTLS, certs: IssuedCerts) -> None:
    wrong = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    wrong.load_cert_chain(certs.wildcard.cert, certs.wildcard.key)  # *.sandbox.test
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def serve() -> bytes:
            conn, _ = server.accept()
            with conn:
                try:
                    with wrong.wrap_socket(conn, server_side=True) as tls_conn:
                        return tls_conn.recv(64)
                except OSError:
                    return b""

        answered = asyncio.ensure_future(asyncio.to_thread(serve))
        with pytest.raises(ssl.SSLCertVerificationError, match=r"127\.0\.0\.1"):
            await asyncio.to_thread(channel.connect, "127.0.0.1", port, b"t" * 32, tls)
        assert await answered == b""


async def test_the_first_bytes_on_the_wire_are_a_tls_handshake_not_the_token(
        tls: PeerTLS) -> None:
    token = secrets.token_bytes(channel.TOKEN_BYTES)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def first_bytes() -> bytes:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(10)
                return conn.recv(4096)  # then closed: the source gives up

        seen = asyncio.ensure_future(asyncio.to_thread(first_bytes))
        with pytest.raises(OSError):
            await asyncio.to_thread(channel.connect, "127.0.0.1", port, token, tls)
        got = await seen
    assert got[:3] == b"\x16\x03\x01", got[:16]  # a TLS record: handshake, the ClientHello
    assert token not in got


@pytest.fixture
async def connected(listening: Listening,
                    tls: PeerTLS) -> AsyncIterator[tuple[ssl.SSLSocket, ssl.SSLSocket]]:
    """A source's and a destination's ends of one stream over mutual TLS."""
    sent = await asyncio.to_thread(channel.connect, "127.0.0.1", listening.port,
                                   listening.token, tls)
    got = await listening.accepting
    assert isinstance(sent, ssl.SSLSocket) and isinstance(got, ssl.SSLSocket)
    yield sent, got
    sent.close()
    got.close()


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(MiB):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
async def relay_pair(
        connected: tuple[ssl.SSLSocket, ssl.SSLSocket]) -> AsyncIterator[tuple[Relay, Relay]]:
    """A source's relay (a VMM writes into its end) and a destination's (a VMM reads)."""
    out = Relay(connected[0], outgoing=True, name="test-relay-out")
    into = Relay(connected[1], outgoing=False, name="test-relay-in")
    out.start()
    into.start()
    yield out, into
    for relay in (out, into):
        relay.stop()
        await relay.done


async def test_a_vmms_stream_goes_through_the_relays_whole_and_its_end_goes_on(
        relay_pair: tuple[Relay, Relay]) -> None:
    out, into = relay_pair
    payload = os.urandom(64 * MiB)

    def write() -> None:
        out.vmm_end.sendall(payload)
        out.vmm_end.close()  # the VMM's stream ended

    started = time.monotonic()
    writer = asyncio.ensure_future(asyncio.to_thread(write))
    received = await asyncio.to_thread(_read_all, into.vmm_end)  # until the EOF passed on
    elapsed = time.monotonic() - started
    await writer
    await out.finish(30)
    await into.finish(30)
    assert received == payload
    assert out.bytes == into.bytes == len(payload)
    print(f"\nTLS relay, both ends: {len(payload) / MiB / elapsed:.0f} MiB/s")


async def test_a_peer_gone_mid_stream_fails_the_vmm_on_the_other_side(
        relay_pair: tuple[Relay, Relay]) -> None:
    out, into = relay_pair
    first = threading.Event()

    def write() -> BaseException | None:
        try:
            while True:
                out.vmm_end.sendall(b"\x00" * MiB)
                first.set()
        except OSError as exc:
            return exc

    writer = asyncio.ensure_future(asyncio.to_thread(write))
    await asyncio.to_thread(first.wait, 10)
    into.stop()  # the destination's side dies
    failed = await asyncio.wait_for(writer, 30)
    assert isinstance(failed, BrokenPipeError | ConnectionResetError), failed
    with pytest.raises(VMMError, match="failed after"):
        await out.finish(30)


async def test_a_file_range_goes_over_tls_in_full(
        connected: tuple[ssl.SSLSocket, ssl.SSLSocket], tmp_path: Path) -> None:
    sent, got = connected
    data = os.urandom(3 * MiB + 8192)
    path = tmp_path / "file"
    path.write_bytes(data)
    offset, length = 4096, 3 * MiB

    def send() -> int:
        with open(path, "rb") as file:
            n = channel.send_file_range(sent, file, offset, length)
        sent.close()
        return n

    sender = asyncio.ensure_future(asyncio.to_thread(send))
    assert await asyncio.to_thread(_read_all, got) == data[offset:offset + length]
    assert await sender == length


def test_tickets_say_tls_and_both_sides_must_agree(tls: PeerTLS) -> None:
    token = secrets.token_bytes(channel.TOKEN_BYTES)
    with_tls = channel.ticket("10.0.0.12", 40000, token, tls)
    plain = channel.ticket("10.0.0.12", 40000, token, None)
    assert channel.checked_ticket(with_tls, tls) == ("10.0.0.12", 40000, token)
    assert channel.checked_ticket(plain, None) == ("10.0.0.12", 40000, token)
    # An agent from before tickets said it streams in clear.
    older = {k: v for k, v in plain.items() if k != "tls"}
    assert channel.checked_ticket(older, None) == ("10.0.0.12", 40000, token)
    with pytest.raises(SetupError, match="over TLS only"):
        channel.checked_ticket(plain, tls)
    with pytest.raises(SetupError, match="over TLS only"):
        channel.checked_ticket(older, tls)
    with pytest.raises(SetupError, match="--tls-client-ca"):
        channel.checked_ticket(with_tls, None)
    with pytest.raises(ValueError, match="not a stream ticket"):
        channel.checked_ticket({**plain, "token": "abcd"}, None)


def _agent_args(cert: Pair, ca: Path | None) -> argparse.Namespace:
    return argparse.Namespace(tls_cert=cert.cert, tls_key=cert.key, tls_client_ca=ca)


def test_an_agent_with_mutual_tls_streams_to_other_agents_over_it(certs: IssuedCerts) -> None:
    config = HostConfig()
    peer = with_peer_tls(config, _agent_args(certs.server, certs.ca)).peer_tls
    assert peer == PeerCerts(certs.server.cert, certs.server.key, certs.ca)
    # TLS without client certificates: the streams stay plain (the agent logs so).
    assert with_peer_tls(config, _agent_args(certs.server, None)).peer_tls is None
    assert with_peer_tls(config, argparse.Namespace()).peer_tls is None


def test_a_certificate_that_cannot_be_a_client_stops_the_agent_at_start(
        certs: IssuedCerts) -> None:
    PeerTLS(PeerCerts(certs.server.cert, certs.server.key, certs.ca)).check()
    with pytest.raises(SetupError, match="serverAuth,clientAuth") as err:
        with_peer_tls(HostConfig(), _agent_args(certs.serving_only, certs.ca))
    assert "certificate purpose" in str(err.value)
    with pytest.raises(SetupError, match="unable to get local issuer"):
        PeerTLS(PeerCerts(certs.server.cert, certs.server.key, certs.other_ca)).check()
