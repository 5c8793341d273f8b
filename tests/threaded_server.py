"""A test's socketserver (an http.server on 127.0.0.1, usually) answering from a thread of
its own while the test runs, and closed after it."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(server: socketserver.BaseServer, join_timeout: float = 10) -> Iterator[None]:
    """`server.serve_forever()` in a daemon thread until the block ends; then it stops
    accepting, its socket is closed and the thread is waited for."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=join_timeout)


def pass_through(src: socket.socket, dst: socket.socket) -> None:
    """Copy `src` to `dst` until `src` ends, then end `dst`'s sending side (one direction of
    a relay a test puts between two peers)."""
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
