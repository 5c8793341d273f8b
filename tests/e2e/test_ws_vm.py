"""WebSocket through the exposed-port proxy to a server inside a real sandbox (the proxy itself
is tested against loopback servers in tests/server/preview/test_ws_proxy.py)."""

from __future__ import annotations

import socket

import pytest
from websockets.sync.client import connect

from pandastack import Sandbox
from tests.e2e.conftest import LiveServer
from tests.sdk_credentials import Credentials

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

# A stdlib WebSocket echo server for the guest (the guest image has no websocket package):
# the RFC 6455 handshake, then text/binary frames echoed back until a close frame.
ECHO_SERVER = r'''
import base64, hashlib, socket, struct, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError
        data += chunk
    return data

def handle(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(1024)
        key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
               if l.lower().startswith(b"sec-websocket-key:")][0]
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while True:
            b0, b1 = read_exact(conn, 2)
            length = b1 & 0x7F
            if length == 126:
                length = struct.unpack(">H", read_exact(conn, 2))[0]
            elif length == 127:
                length = struct.unpack(">Q", read_exact(conn, 8))[0]
            mask = read_exact(conn, 4) if b1 & 0x80 else b"\0\0\0\0"
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(read_exact(conn, length)))
            if b0 & 0x0F == 8:
                conn.sendall(b"\x88\x00")
                return
            header = bytes([b0]) + (bytes([len(data)]) if len(data) < 126
                                    else b"\x7e" + struct.pack(">H", len(data)))
            conn.sendall(header + data)

srv = socket.create_server(("0.0.0.0", 8765))
while True:
    threading.Thread(target=handle, args=(srv.accept()[0],), daemon=True).start()
'''


def test_websocket_to_a_server_in_the_sandbox(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    with Sandbox.create(ttl_seconds=300, **creds) as sbx:
        sbx.filesystem.write("/work/echo.py", ECHO_SERVER)
        sbx.commands.start(["python3", "/work/echo.py"])
        # The proxy answers the handshake before it dials the sandbox: wait (bounded) until
        # the server in the sandbox listens.
        listening = sbx.exec("for i in $(seq 100); do ss -ltn | grep -q ':8765 ' && exit 0; "
                             "sleep 0.2; done; exit 1", timeout_seconds=60)
        assert listening.exit_code == 0, listening
        ws_base = sbx.get_url(8765).replace("http://", "ws://", 1)
        headers = {"Authorization": f"Bearer {live_server.api_key}"}
        ws = connect(ws_base + "chat", additional_headers=headers, proxy=None, open_timeout=10)
        with ws:
            ws.send("hello from the host")
            assert ws.recv(10) == "hello from the host"
            ws.send(b"\x00\xffbinary")
            assert ws.recv(10) == b"\x00\xffbinary"
        signed = sbx.signed_url(8765, ttl_seconds=60)  # on the port's own origin
        base, _, query = signed.partition("?")
        sock = socket.create_connection(("127.0.0.1", live_server.preview_port), timeout=10)
        with connect(base.replace("http://", "ws://", 1) + "x?" + query, sock=sock,
                     proxy=None, open_timeout=10) as ws:
            ws.send("signed")
            assert ws.recv(10) == "signed"
