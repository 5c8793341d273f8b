"""TLS for the sync terminal's WebSocket that two threads may use at once.

websockets' sync client reads in a thread of its own while the caller's thread writes. Over
`wss://` it would do both on one `ssl.SSLSocket`, whose OpenSSL object must not be entered by
two threads at once: when the server's session tickets arrive while the upgrade request is
being written, the request can be lost, the server waits for it, the client waits for the
answer, and closing after the open timeout then waits on the reader thread, blocked in a
read no close wakes (seen once in CI: 13 minutes). Here one `ssl.SSLObject` over memory
buffers does the TLS; its calls are serialised by a lock that is never held across a wait on
the network, and what it emits goes out in the order it was made."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from typing import Any

from websockets.typing import BytesLike

RECV_BYTES = 1 << 16


class LockedTLSSocket:
    """A connected TLS client socket as websockets' sync connection uses one (recv, sendall,
    fileno for its selector, shutdown, close; the rest is the plain socket's)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str,
                 timeout: float) -> None:
        self._raw = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing,
                                     server_hostname=server_hostname)
        self._state = threading.Lock()  # the SSLObject and its two buffers
        self._wire = threading.Lock()  # taking bytes out of _outgoing and sending them
        sock.settimeout(timeout)
        self._handshake()
        sock.settimeout(None)

    def _handshake(self) -> None:
        # One thread so far: websockets starts its reader after this returns.
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    raise ConnectionError("the server closed the connection during the TLS "
                                          "handshake") from None
                continue
            self._flush()
            return

    def _flush(self) -> None:
        """Send what the TLS object has emitted; extraction and send under one lock, so two
        threads never put records on the wire out of order."""
        with self._wire:
            with self._state:
                out = self._outgoing.read()
            if out:
                self._raw.sendall(out)

    def _fill(self) -> bool:
        """Wait for bytes from the network (holding no lock) and give them to the TLS
        object; False at the end of the stream."""
        data = self._raw.recv(RECV_BYTES)
        with self._state:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
        return bool(data)

    def recv(self, bufsize: int) -> bytes:
        """All the plaintext the buffered records hold (possibly more than `bufsize`: a
        record left decrypted here would not wake the caller's selector), waiting for the
        network when there is none; b"" at the end of the stream."""
        while True:
            chunks: list[bytes] = []
            ended = False
            with self._state:
                while True:
                    try:
                        chunk = self._tls.read(max(bufsize, RECV_BYTES))
                    except ssl.SSLWantReadError:
                        break
                    except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                        ended = True
                        break
                    if not chunk:
                        ended = True
                        break
                    chunks.append(chunk)
                emitted = self._outgoing.pending > 0  # e.g. the answer to a key update
            if emitted:
                self._flush()
            if chunks:
                return b"".join(chunks)
            if ended:
                return b""
            self._fill()

    def sendall(self, data: BytesLike) -> None:
        with self._wire:
            with self._state:
                view = memoryview(data).cast("B")
                while view:
                    n = self._tls.write(view)
                    view = view[n:]
                out = self._outgoing.read()
            self._raw.sendall(out)

    def send(self, data: BytesLike) -> int:
        self.sendall(data)
        return len(memoryview(data).cast("B"))

    def close(self) -> None:
        # Shut down first: it wakes a reader blocked in recv on this socket, which a close
        # alone does not, so a connection given up on is let go at once.
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        self._raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
