"""`serve` keeps an idle connection longer than its clients do: a request sent on a kept
connection after more than uvicorn's default 5 s (a client that waited out `Retry-After: 5`)
is answered, not met by the server's close."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from pandastack.cli.serve import KEEP_ALIVE_S
from tests.server.live import fake_server

UVICORN_DEFAULT_S = 5.0


def _get_health(sock: socket.socket, host: str) -> bytes:
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection (got {data!r})"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(4096)
    return head.split(b"\r\n")[0]


def test_a_kept_connection_outlives_uvicorns_default(tmp_path: Path) -> None:
    assert KEEP_ALIVE_S > 60  # above nginx's upstream keepalive_timeout, too
    with fake_server(tmp_path) as srv:
        host = srv.url.removeprefix("http://")
        address, port = host.split(":")
        with socket.create_connection((address, int(port)), timeout=10) as sock:
            assert _get_health(sock, host) == b"HTTP/1.1 200 OK"
            # The point is the time the connection sat idle: past the default, well short
            # of ours.
            time.sleep(UVICORN_DEFAULT_S + 1.5)
            assert _get_health(sock, host) == b"HTTP/1.1 200 OK"
