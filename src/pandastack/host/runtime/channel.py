"""The one-shot channel between two agents that a live migration's memory (ADR 0023) and a
direct fork's snapshot (ADR 0024) go through. The destination listens on its own address
for one connection that opens with a one-time token (the ticket: address, port, token);
strangers are closed, a bounded number of them, and the listener waits a bounded time.

With the agents' certificates (`HostConfig.peer_tls`, ADR 0048 addendum) the connection is
mutual TLS by the operator's CA before anything else: the destination refuses a source
without a certificate that CA issued, the source checks the destination's certificate
names the ticket's address, and the token goes inside TLS (it still says which stream this
is: a certificate says only that the peer is one of the operator's agents). The ticket says
`tls`, so that a source with certificates never streams in clear to one without, and the
reverse fails at once with a word on what to set.

QEMU writes and reads its migration stream on a descriptor the agent hands it, and cannot
speak TLS on it without holding the agent's private key (a process that runs guest code,
jailed: ADR 0036). With TLS the VMM gets one end of a socket pair instead and a `Relay`
thread carries the bytes between the other end and the TLS connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import os
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from pandastack.host.config import PeerCerts
from pandastack.hostport.errors import SetupError, VMMError

TOKEN_BYTES = 32
# How many connections that do not open with the token (or fail the TLS handshake) the
# destination closes before it stops listening, and how long each may take to say it.
MAX_STRANGERS = 8
TOKEN_READ_S = 5.0
CONNECT_S = 10.0
# A relay whose connection moves no byte for this long is dead (its stream's own bound is
# the caller's: the VMM's wait, the transfer's deadline).
RELAY_IDLE_S = 60.0
# Bytes per read: large enough that the TLS records (16 KiB each) are written in batches.
CHUNK = 1 << 20
# Room in the socket pair between the VMM and the relay, each way.
PAIR_BUFFER = 4 << 20


class PeerTLS:
    """The SSL contexts of an agent's streams to and from other agents."""

    def __init__(self, certs: PeerCerts) -> None:
        self.certs = certs
        try:
            self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.server.load_cert_chain(certs.cert, certs.key)
            self.server.load_verify_locations(cafile=certs.ca)
            self.server.verify_mode = ssl.CERT_REQUIRED
            # No session to resume (one stream each), and a ticket the source never reads
            # would make its close a reset that may cut what it sent last.
            self.server.num_tickets = 0
            # Verifies the peer's name (the ticket's address) and the CA's signature.
            self.client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=certs.ca)
            self.client.load_cert_chain(certs.cert, certs.key)
        except (OSError, ssl.SSLError) as exc:
            raise SetupError(f"the agents' stream TLS ({certs.cert}, {certs.key}, CA "
                             f"{certs.ca}): {exc}") from None
        for ctx in (self.server, self.client):
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3

    def check(self) -> None:
        """SetupError unless this agent's certificate passes as both ends of a stream: its
        CA's server certificate and client certificate (extendedKeyUsage serverAuth and
        clientAuth). A handshake with itself in memory, so that an agent started with a
        certificate that only serves finds out now, not at its first drain."""
        client_side = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.certs.ca)
        client_side.check_hostname = False  # names are checked per ticket, not here
        client_side.load_cert_chain(self.certs.cert, self.certs.key)
        to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
        server = self.server.wrap_bio(to_server, to_client, server_side=True)
        client = client_side.wrap_bio(to_client, to_server, server_side=False)
        try:
            for _ in range(8):
                done = 0
                for end in (client, server):
                    try:
                        end.do_handshake()
                        done += 1
                    except ssl.SSLWantReadError:
                        pass
                if done == 2:
                    # TLS 1.3: the client's certificate is judged on the server's first read.
                    client.write(b"x")
                    server.read(1)
                    return
        except ssl.SSLError as exc:
            raise SetupError(
                f"{self.certs.cert} cannot serve the agents' streams: "
                f"{getattr(exc, 'verify_message', None) or exc.reason or exc} "
                "(an agent shows its certificate to other agents as a server and as a "
                "client: it needs extendedKeyUsage=serverAuth,clientAuth from the CA "
                f"{self.certs.ca})") from None
        raise SetupError(f"{self.certs.cert}: the handshake with itself did not end")


@functools.cache
def peer_tls(certs: PeerCerts | None) -> PeerTLS | None:
    """One PeerTLS per set of files and process (None: plain streams)."""
    return None if certs is None else PeerTLS(certs)


def ticket(host: str, port: int, token: bytes, tls: PeerTLS | None) -> dict[str, Any]:
    return {"host": host, "port": port, "token": token.hex(), "tls": tls is not None}


def checked_ticket(ticket: dict[str, Any], tls: PeerTLS | None) -> tuple[str, int, bytes]:
    """The ticket's address, port and token; ValueError for what is no ticket, SetupError
    where one side has TLS and the other does not (a ticket without `tls` is plain: an
    agent from before it)."""
    try:
        token = bytes.fromhex(str(ticket["token"]))
        host, port = str(ticket["host"]), int(ticket["port"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"not a stream ticket: {exc}") from None
    if len(token) != TOKEN_BYTES or not 0 < port < 65536:
        raise ValueError("not a stream ticket")
    wants_tls = bool(ticket.get("tls", False))
    if tls is not None and not wants_tls:
        raise SetupError(f"the destination {host} takes the stream in clear (no "
                         "--tls-client-ca there): this agent sends it over TLS only")
    if tls is None and wants_tls:
        raise SetupError(f"the destination {host} takes the stream over mutual TLS only: "
                         "give this agent --tls-cert, --tls-key and --tls-client-ca too")
    return host, port, token


def listen(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(1)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(host: str, port: int, token: bytes, tls: PeerTLS | None) -> socket.socket:
    """A connection to the ticket's listener that opened with the token (blocking; an
    SSLSocket with `tls`). OSError (ssl.SSLError included) where it cannot."""
    sock = socket.create_connection((host, port), timeout=CONNECT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.client.wrap_socket(sock, server_hostname=host)
        sock.sendall(token)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


def _opened(conn: socket.socket, token: bytes, tls: PeerTLS | None) -> socket.socket | None:
    """`conn` (TLS: its SSLSocket) if it opens with the token, else None, `conn` closed."""
    try:
        conn.setblocking(True)
        conn.settimeout(TOKEN_READ_S)
        if tls is not None:
            conn = tls.server.wrap_socket(conn, server_side=True)
        got = b""
        while len(got) < len(token):
            chunk = conn.recv(len(token) - len(got))
            if not chunk:
                break
            got += chunk
        if hmac.compare_digest(got, token):
            conn.settimeout(None)
            return conn
    except OSError:  # ssl.SSLError too: no certificate, or one another CA issued
        pass
    conn.close()
    return None


def _close_result(task: asyncio.Future[socket.socket | None]) -> None:
    if not task.cancelled() and task.exception() is None and (sock := task.result()):
        sock.close()


async def accept(listener: socket.socket, token: bytes, tls: PeerTLS | None,
                 within_s: float) -> socket.socket:
    """The one connection that opens with `token` (blocking, no timeout; with `tls` an
    SSLSocket whose peer showed a certificate of the CA); the listener closed then. Others
    are closed (at most MAX_STRANGERS); VMMError when none came in `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    for _ in range(MAX_STRANGERS + 1):
        try:
            conn, _peer = await asyncio.wait_for(loop.sock_accept(listener),
                                                 max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise VMMError(f"no source connected in {within_s:.0f}s") from None
        # The handshake and the token in a thread, bounded by TOKEN_READ_S; a caller that
        # gives up meanwhile leaves the thread to finish, and its connection is closed.
        opening = asyncio.ensure_future(asyncio.to_thread(_opened, conn, token, tls))
        try:
            opened = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_result)
            raise
        if opened is not None:
            listener.close()
            return opened
    raise VMMError(f"no source connected with the token ({MAX_STRANGERS} did not)")


def send_file_range(sock: socket.socket, file: BinaryIO, offset: int, length: int) -> int:
    """`length` bytes of `file` at `offset` into `sock`; the bytes sent (fewer: the file
    ended). A plain socket takes them by sendfile (no copy); a TLS one by reads of CHUNK
    (socket.sendfile on an SSLSocket would send 8 KiB at a time)."""
    if not isinstance(sock, ssl.SSLSocket):
        return sock.sendfile(file, offset, length)
    buffer = memoryview(bytearray(min(CHUNK, max(length, 1))))
    sent = 0
    while sent < length:
        n = os.preadv(file.fileno(), [buffer[:min(len(buffer), length - sent)]], offset + sent)
        if n == 0:
            break
        sock.sendall(buffer[:n])
        sent += n
    return sent


class Relay:
    """A VMM's stream between its end of a socket pair (`vmm_end`, to hand over; the caller
    closes its own copy once the VMM holds one) and a TLS connection, in a thread. One way,
    as QEMU's precopy stream goes (no return path, no postcopy): `outgoing` carries what the
    VMM writes to the peer, else what the peer sends to the VMM. The end of the stream goes
    on: the pair's write side shut (by the caller once the VMM says its stream is complete,
    or the VMM closing its end) is a TLS close_notify to the peer, the peer's is an EOF to
    the VMM. A failure on either side closes both, which fails the VMM's migration."""

    def __init__(self, conn: ssl.SSLSocket, *, outgoing: bool, name: str) -> None:
        self.conn = conn
        self.outgoing = outgoing
        self.vmm_end, self._ours = socket.socketpair()
        for end in (self.vmm_end, self._ours):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PAIR_BUFFER)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PAIR_BUFFER)
        self.bytes = 0
        self.error: BaseException | None = None
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(loop,), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self.conn.settimeout(RELAY_IDLE_S)
            self._ours.settimeout(RELAY_IDLE_S)
            if self.outgoing:
                self._pump(self._ours.recv_into, self.conn.sendall)
                self.conn.settimeout(TOKEN_READ_S)
                # close_notify: the stream ended here, it was not cut. The peer may close
                # without its own: all it needed had come.
                with contextlib.suppress(OSError, ValueError):
                    self.conn.unwrap()
            else:
                self._pump(self.conn.recv_into, self._ours.sendall)
                self._ours.shutdown(socket.SHUT_WR)
        except BaseException as exc:  # handed to the awaiting side
            self.error = exc
        finally:
            self._wake()
            self._ours.close()
            self.conn.close()
            self._finished.set()
            loop.call_soon_threadsafe(self._settle)

    def _pump(self, read: Callable[[memoryview], int],
              write: Callable[[memoryview], None]) -> None:
        buffer = memoryview(bytearray(CHUNK))
        while n := read(buffer):
            write(buffer[:n])
            self.bytes += n

    def _settle(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _wake(self) -> None:
        """Shuts both of the relay's connections: a thread blocked on one wakes. The base
        class's shutdown, not TLS's, which would write to a connection another thread uses."""
        for sock in (self._ours, self.conn):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    async def finish(self, timeout: float) -> None:
        """Until the stream has ended (VMMError if it failed, or did not end in time)."""
        try:
            await asyncio.wait_for(asyncio.shield(self.done), timeout)
        except TimeoutError:
            self.stop()
            raise VMMError(f"the TLS relay did not end in {timeout:.0f}s") from None
        if self.error is not None:
            raise VMMError(f"the TLS stream failed after {self.bytes} bytes: "
                           f"{self.error}") from self.error

    def stop(self) -> None:
        """Ends the relay now: its thread wakes and goes (or, never started, its sockets)."""
        self.vmm_end.close()
        if self._thread.is_alive() or self._finished.is_set():
            self._wake()
            return
        self._ours.close()
        self.conn.close()
        self._settle()
