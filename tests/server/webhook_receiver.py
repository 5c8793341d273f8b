"""A webhook receiver on 127.0.0.1 for tests: records each POST, answers the statuses it is
told (then 204). Started and stopped by the test that uses it. A trickling one sends its
answer a byte at a time (each within any per-read timeout) until the test releases it or
`trickle_for` seconds pass, as a slow or hostile endpoint would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    #: Set by the test: trickling answers finish now.
    release: threading.Event = field(default_factory=threading.Event)
    #: Answers sent in full.
    answered: int = 0

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.got) >= count, timeout)
            return list(self.got)


@contextmanager
def receiver(redirect_to: str | None = None, trickle_for: float | None = None,
             trickle_every: float = 0.2) -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with state.arrived:
                state.got.append(Received(self.path, dict(self.headers.items()), body))
                status = state.statuses.pop(0) if state.statuses else 204
                state.arrived.notify_all()
            if trickle_for is not None:
                try:
                    self.trickle()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up: not answered
            else:
                self.send_response(status)
                if redirect_to is not None and 300 <= status < 400:
                    self.send_header("Location", redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
            with state.arrived:
                state.answered += 1
                state.arrived.notify_all()

        def trickle(self) -> None:
            assert trickle_for is not None
            end = time.monotonic() + trickle_for
            self.wfile.write(b"HTTP/1.1 204 No Content\r\nX-Slow: ")
            while time.monotonic() < end and not state.release.wait(trickle_every):
                self.wfile.write(b"a")
            self.wfile.write(b"\r\nContent-Length: 0\r\n\r\n")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
        assert not thread.is_alive()
