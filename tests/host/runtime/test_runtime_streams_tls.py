"""A live migration and a direct fork's stream between two runtimes whose agents have
certificates of one operator's CA (mutual TLS, ADR 0048 addendum), on real VMs and a real S3
server; certificates made by the test with openssl. Each stream goes through a tap on
loopback that keeps what the source sent: over TLS its first bytes are a TLS record and the
value a guest process holds in its memory is nowhere in it; with plain runtimes the same tap
sees the token, QEMU's migration magic and that value (so the check can see it). A source
without the CA's certificate is refused, and the real one still gets in; a destination
that dies before the switch fails the source's stream through both relays, and the source's
guest runs on."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import TracebackType

import pytest

from pandastack.host.config import HostConfig, PeerCerts
from pandastack.host.objects import ObjectStoreConfig
from pandastack.host.vmm.qemu import qmp
from pandastack.hostport.errors import HostError
from tests.helpers import holder_value, start_holder
from tests.host.runtime.test_runtime_object_store import Host, runtimes, store_config
from tests.threaded_server import pass_through
from tests.tls_certs import IssuedCerts, Pair, make_test_certs

__all__ = ["store_config"]  # the fixture, shared

pytestmark = pytest.mark.vm
TLS_HANDSHAKE = b"\x16\x03\x01"  # a TLS record: handshake (the ClientHello)
QEMU_MAGIC = b"QEVM"  # QEMU_VM_FILE_MAGIC: a migration stream's first bytes


class WireTap:
    """A TCP proxy on loopback in front of a ticket's listener, for one connection: what
    the source sent through it (its first bytes, how many, whether `marker` was among them)
    is kept; the destination's answers pass back."""

    def __init__(self, port: int, marker: bytes) -> None:
        self.upstream = port
        self.marker = marker
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.first = b""
        self.count = 0
        self.seen_marker = False
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = [self.server]

    def __enter__(self) -> WireTap:
        self._spawn(self._serve)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(30)
        assert not any(t.is_alive() for t in self._threads), "the tap's threads still run"

    def ticket(self, ticket: dict[str, object]) -> dict[str, object]:
        return {**ticket, "port": self.port}

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        self.server.settimeout(120)
        try:
            source, _ = self.server.accept()
        except OSError:
            return
        dest = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
        for sock in (source, dest):
            sock.settimeout(None)
        self._socks += [source, dest]
        self._spawn(pass_through, dest, source)
        tail = b""
        with contextlib.suppress(OSError):
            while chunk := source.recv(1 << 20):
                if len(self.first) < 64:
                    self.first += chunk[:64 - len(self.first)]
                self.count += len(chunk)
                window = tail + chunk
                self.seen_marker = self.seen_marker or self.marker in window
                tail = window[-len(self.marker):]
                dest.sendall(chunk)
        with contextlib.suppress(OSError):
            dest.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> IssuedCerts:
    return make_test_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
async def tls_hosts(host_config: HostConfig, store_config: ObjectStoreConfig,
                    certs: IssuedCerts) -> AsyncIterator[tuple[Host, Host]]:
    """Two agents' runtimes with the same operator's certificate (it names 127.0.0.1)."""
    peer = PeerCerts(certs.server.cert, certs.server.key, certs.ca)
    async with runtimes(host_config, store_config, peer_tls=peer) as make:
        yield await make(), await make()


@pytest.fixture(scope="module")
async def plain_hosts(host_config: HostConfig,
                      store_config: ObjectStoreConfig) -> AsyncIterator[tuple[Host, Host]]:
    async with runtimes(host_config, store_config) as make:
        yield await make(), await make()





async def _migrate(a: Host, b: Host, sid: str) -> dict[str, object]:
    offer = await a.rt.migrations.offer(sid)
    ticket = await b.rt.migrations.accept(sid, offer, "127.0.0.1")
    handoff = await a.rt.migrations.send(sid, ticket)
    await b.rt.migrations.complete(sid, handoff)
    await a.rt.migrations.release(sid)
    return handoff


@contextlib.contextmanager
def _tapping(ticket: dict[str, object], marker: str) -> Iterator[WireTap]:
    with WireTap(int(str(ticket["port"])), marker.encode()) as tap:
        yield tap


async def _moves_and_back(a: Host, b: Host, mode: str) -> tuple[WireTap, str, bytes]:
    """A sandbox holding a value moved a -> b through a tap, then b -> a without one (its
    stream timed: the figure printed); the tap, the value, the ticket's token."""
    sbx = await a.rt.create()
    pid, value = await start_holder(sbx)
    offer = await a.rt.migrations.offer(sbx.id)
    ticket = await b.rt.migrations.accept(sbx.id, offer, "127.0.0.1")
    assert ticket["tls"] is (mode == "tls")
    with _tapping(ticket, value) as tap:
        handoff = await a.rt.migrations.send(sbx.id, tap.ticket(ticket))
        await b.rt.migrations.complete(sbx.id, handoff)
    await a.rt.migrations.release(sbx.id)
    moved = b.rt.get(sbx.id)
    assert await holder_value(moved, pid) == value
    assert tap.count >= int(str(handoff["bytes"])), (tap.count, handoff)

    started = time.monotonic()
    back = await _migrate(b, a, sbx.id)
    print(f"\n{mode} migration stream: {back['total_ms']:.0f} ms for "
          f"{int(str(back['bytes'])) >> 20} MiB (downtime {back['downtime_ms']:.0f} ms, "
          f"{back['method']}); the whole move {(time.monotonic() - started) * 1000:.0f} ms")
    assert await holder_value(a.rt.get(sbx.id), pid) == value
    await a.rt.kill(sbx.id)
    return tap, value, bytes.fromhex(str(ticket["token"]))


async def test_a_migration_over_mutual_tls_carries_the_memory_but_not_in_clear(
        tls_hosts: tuple[Host, Host]) -> None:
    a, b = tls_hosts
    tap, _value, token = await _moves_and_back(a, b, "tls")
    assert tap.first[:3] == TLS_HANDSHAKE, tap.first
    assert token not in tap.first and QEMU_MAGIC not in tap.first
    assert not tap.seen_marker, "the guest's value crossed the wire in clear"


async def test_a_plain_migration_shows_what_tls_hides(
        plain_hosts: tuple[Host, Host]) -> None:
    """The control: without certificates the tap sees the token, QEMU's stream and the
    value the guest holds (the check above would see them too)."""
    a, b = plain_hosts
    tap, _value, token = await _moves_and_back(a, b, "plain")
    assert tap.first[:32] == token and tap.first[32:36] == QEMU_MAGIC, tap.first
    assert tap.seen_marker


def _knock(ticket: dict[str, object], ca: Path, cert: Pair | None) -> bytes:
    """What the destination answers a TLS client with `cert` and the ticket's own token:
    b"" closed, b"refused: ..." a handshake or first read that failed."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    host, port = str(ticket["host"]), int(str(ticket["port"]))
    try:
        with socket.create_connection((host, port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as conn:
            conn.sendall(bytes.fromhex(str(ticket["token"])))
            return conn.recv(1)
    except OSError as exc:
        return f"refused: {exc}".encode()


async def test_a_fork_streamed_over_mutual_tls_refuses_a_source_without_the_cas_certificate(
        tls_hosts: tuple[Host, Host], certs: IssuedCerts) -> None:
    a, b = tls_hosts
    parent = await a.rt.create()
    pid, value = await start_holder(parent)
    offer = await a.rt.transfers.offer(parent.id)
    snap_id = offer["snapshot"]["id"]
    ticket = await b.rt.transfers.accept(offer, "127.0.0.1")
    assert ticket["tls"] is True
    # With the token but no certificate, or one another CA issued: refused at the handshake.
    for cert in (None, certs.stranger):
        answer = await asyncio.to_thread(_knock, ticket, certs.ca, cert)
        assert answer.startswith(b"refused"), answer
    # The operator's certificate but not the token: closed.
    stranger = {**ticket, "token": secrets.token_hex(32)}
    assert await asyncio.to_thread(_knock, stranger, certs.ca, certs.server) == b""

    with _tapping(ticket, value) as tap:
        await a.rt.transfers.send(snap_id, tap.ticket(ticket))
    assert tap.first[:3] == TLS_HANDSHAKE, tap.first
    assert tap.count > 1 << 20
    assert not tap.seen_marker, "the snapshot's memory crossed the wire in clear"
    child = await b.rt.create(snapshot=snap_id)
    assert await holder_value(child, pid) == value
    for host in (a, b):
        await asyncio.to_thread(host.rt.delete_snapshot, snap_id)
    await b.rt.kill(child.id)
    await a.rt.kill(parent.id)


async def test_a_tls_destination_that_dies_before_the_switch_leaves_the_source_running(
        tls_hosts: tuple[Host, Host], monkeypatch: pytest.MonkeyPatch) -> None:
    """The relays' failure path with QEMU on both ends: the destination's VMM gone, its
    relay closes the TLS connection, the source's relay its socket pair, and the source's
    VMM's migration fails; the guest runs on there, and moves later."""
    a, b = tls_hosts
    sbx = await a.rt.create()
    pid, value = await start_holder(sbx)
    offer = await a.rt.migrations.offer(sbx.id)
    ticket = await b.rt.migrations.accept(sbx.id, offer, "127.0.0.1")
    incoming = b.rt.migrations._incoming[sbx.id].vm
    assert incoming is not None
    await asyncio.to_thread(incoming.kill)
    with monkeypatch.context() as shorter:
        # The destination retries its dead VMM's QMP socket this long before it gives up.
        shorter.setattr(qmp, "QMP_CONNECT_S", 5.0)
        with pytest.raises((HostError, OSError)):
            await a.rt.migrations.send(sbx.id, ticket)
    await b.rt.migrations.abort(sbx.id)
    assert a.rt.get(sbx.id).state == "running"
    assert await holder_value(sbx, pid) == value
    await _migrate(a, b, sbx.id)
    assert await holder_value(b.rt.get(sbx.id), pid) == value
    await b.rt.kill(sbx.id)
