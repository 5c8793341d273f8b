"""A loopback proxy in front of a real registry that records the path of every request it
forwards: what a test counts to show which of an image's parts a pull asked for."""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.threaded_server import serving

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host"}


@dataclass
class Counting:
    host: str = ""  # 127.0.0.1:port, the address to pull from
    paths: list[str] = field(default_factory=list)

    def blobs(self) -> list[str]:
        return [path for path in self.paths if "/blobs/" in path]

    def manifests(self) -> list[str]:
        return [path for path in self.paths if "/manifests/" in path]


@contextlib.contextmanager
def counting_proxy(upstream: str) -> Iterator[Counting]:
    """Forward GETs (all a pull sends) to the registry at `upstream` (host:port, plain
    HTTP)."""
    state = Counting()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            state.paths.append(self.path)
            conn = http.client.HTTPConnection(upstream, timeout=30)
            try:
                conn.request(self.command, self.path, headers={
                    k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP})
                answer = conn.getresponse()
                body = answer.read()
            finally:
                conn.close()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.host = f"127.0.0.1:{server.server_address[1]}"
    with serving(server):
        yield state
