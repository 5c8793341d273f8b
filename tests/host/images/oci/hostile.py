"""A registry that misbehaves on purpose, on loopback: it answers each path as the test says
(status, headers, body) and records the requests it got. What a real registry never sends
(a blob longer than its descriptor, a redirect to plain HTTP, a huge manifest) is how a
hostile one would attack the client."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.threaded_server import serving

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Sent a byte at a time, each after this event is set or 0.2 s passed (a dripping server).
    drip: threading.Event | None = None


@dataclass
class Hostile:
    host: str = ""
    answers: dict[str, Answer] = field(default_factory=dict)
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    # An Authorization header every request must carry (else 401 with a Basic challenge).
    require: str | None = None

    def image(self, repository: str, config: bytes, layers: list[tuple[bytes, int]]) -> None:
        """Serve `repository:v1`: a manifest of `config` and layers as (bytes served, size
        claimed in the descriptor)."""
        def descriptor(data: bytes, size: int, media: str) -> dict[str, object]:
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            self.answers[f"/v2/{repository}/blobs/{digest}"] = Answer(body=data)
            return {"mediaType": media, "digest": digest, "size": size}

        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": descriptor(config, len(config),
                                         "application/vnd.oci.image.config.v1+json"),
                    "layers": [descriptor(data, size, "application/vnd.oci.image.layer.v1.tar")
                               for data, size in layers]}
        self.answers[f"/v2/{repository}/manifests/v1"] = Answer(
            body=json.dumps(manifest).encode(), headers={"Content-Type": OCI_MANIFEST})


@contextlib.contextmanager
def run_hostile() -> Iterator[Hostile]:
    state = Hostile()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            state.seen.append((self.path, dict(self.headers)))
            answer = state.answers.get(self.path.split("?")[0], Answer(404))
            if state.require is not None and self.headers.get("Authorization") != state.require:
                answer = Answer(401, headers={"WWW-Authenticate": 'Basic realm="hostile"'})
            self.send_response(answer.status)
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            if answer.drip is None:
                self.wfile.write(answer.body)
                return
            for byte in answer.body:
                if answer.drip.wait(0.2):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.host = f"127.0.0.1:{server.server_address[1]}"
    with serving(server):
        yield state
