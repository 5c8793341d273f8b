"""Handles made by `Sandbox.create`/`connect` share this process's connections to their
server (sdk/_shared_http.py): the second create reuses the first one's TCP connection. Async
handles share their event loop's, which close when the loop shuts down. Checked against a real
HTTP/1.1 server on loopback that counts the connections it accepts."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pandastack.sdk import AsyncSandbox, Sandbox
from pandastack.sdk._shared_http import shared_http
from pandastack.sdk.config import resolve_config
from tests.sdk.fakes import SANDBOX
from tests.threaded_server import serving


class CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.accepted = 0
        self.ended = threading.Semaphore(0)  # released once per connection the client closed

    def get_request(self) -> tuple[socket.socket, Any]:
        request = super().get_request()
        self.accepted += 1
        return request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn does
    server: CountingServer

    def _reply(self, status: int, data: object | None) -> None:
        body = b"" if data is None else json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._reply(201, SANDBOX)

    def do_GET(self) -> None:
        self._reply(200, SANDBOX)

    def do_DELETE(self) -> None:
        self._reply(204, None)

    def finish(self) -> None:
        super().finish()
        self.server.ended.release()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[CountingServer]:
    srv = CountingServer()
    with serving(srv, join_timeout=5):
        yield srv


def test_creates_in_one_process_share_one_connection(server: CountingServer) -> None:
    first = Sandbox.create(api_url=server.url, api_key="k1")
    first.kill()
    first.close()  # a shared pool stays open for the next handle
    second = Sandbox.create(api_url=server.url, api_key="k1")
    again = Sandbox.connect("sb-1", api_url=server.url, api_key="k1")
    second.kill()
    assert second._http is first._http is again._http
    assert server.accepted == 1
    other_key = Sandbox.create(api_url=server.url, api_key="k2")
    assert other_key._http is not first._http  # the key is a header of the pool's client
    assert server.accepted == 2


def test_async_creates_share_their_loops_connection_closed_with_the_loop(
        server: CountingServer) -> None:
    async def two_creates() -> AsyncSandbox:
        async with await AsyncSandbox.create(api_url=server.url, api_key="k") as first:
            pass
        async with await AsyncSandbox.create(api_url=server.url, api_key="k") as second:
            assert second._http is first._http
        return second

    handle = asyncio.run(two_creates())
    assert server.accepted == 1
    assert handle._http._client.is_closed  # asyncio.run shut the loop's pool down
    assert server.ended.acquire(timeout=10)  # and the server saw the connection end
    # A new loop cannot use the old loop's connections: it opens its own.
    again = asyncio.run(two_creates())
    assert again._http is not handle._http
    assert server.accepted == 2


def test_a_forked_child_opens_its_own_pool(server: CountingServer) -> None:
    config = resolve_config(server.url, "k")
    parent_pool = shared_http(config)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        os._exit(0 if shared_http(config) is not parent_pool else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shared_http(config) is parent_pool
