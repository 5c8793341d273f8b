"""A fake pandastack API for SDK unit tests: an httpx handler that routes and records requests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx

API_URL = "http://pandastack.test"
API_KEY = "psk_test_secret"

Reply = Callable[[httpx.Request], httpx.Response]

SANDBOX: dict[str, Any] = {
    "id": "sb-1",
    "template": "base",
    "state": "running",
    "created_at": 1000.0,
    "expires_at": 1900.0,
    "ttl_seconds": 900,
    "persistent": False,
    "vcpus": 1,
    "memory_mb": 512,
    "metadata": {},
}
LIFECYCLE: dict[str, Any] = {
    "ttl_seconds": 900,
    "persistent": False,
    "created_at": 1000.0,
    "expires_at": 1900.0,
    "last_activity_at": 1001.0,
    "idle_timeout_seconds": 600,
    "state": "running",
}
FILE_ENTRY: dict[str, Any] = {
    "name": "a.txt",
    "path": "/work/a.txt",
    "type": "file",
    "size": 3,
    "mode": 0o644,
    "mtime": 1000.0,
}


def exec_result(**fields: Any) -> dict[str, Any]:
    return {
        "exit_code": 0,
        "stdout": "",
        "stderr": "",
        "duration_ms": 12.5,
        "timed_out": False,
        **fields,
    }


def envelope(code: str, message: str, request_id: str = "req-123") -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "request_id": request_id}}


def reply(status: int = 200, data: Any = None, headers: dict[str, str] | None = None) -> Reply:
    """A route answering `status` with `data` as JSON (no body when data is None)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if data is None:
            return httpx.Response(status, headers=headers)
        return httpx.Response(status, json=data, headers=headers)

    return handle


def sse(*events: tuple[str, Any]) -> bytes:
    """An event-stream body (CRLF line ends, to exercise the decoder)."""
    return b"".join(
        f"event: {name}\r\ndata: {json.dumps(data)}\r\n\r\n".encode() for name, data in events
    )


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def stream_reply(
    body: Iterable[bytes], status: int = 200, content_type: str = "text/event-stream"
) -> Reply:
    """A route streaming `body` chunk by chunk (sync clients)."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, content=iter(list(body)), headers={"content-type": content_type}
        )

    return handle


def astream_reply(
    body: Iterable[bytes], status: int = 200, content_type: str = "text/event-stream"
) -> Reply:
    """A route streaming `body` chunk by chunk (async clients)."""
    chunks = list(body)

    async def gen() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=gen(), headers={"content-type": content_type})

    return handle


class FakeAPI:
    """Routes (method, path) to replies and records every request it saw."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Reply] = {}
        self.requests: list[httpx.Request] = []

    def on(self, method: str, path: str, handler: Reply) -> FakeAPI:
        self.routes[(method, path)] = handler
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return httpx.Response(
                404, json=envelope("not_found", f"no route {request.url.path}", "req-none")
            )
        return handler(request)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def calls(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def last(self, method: str, path: str) -> httpx.Request:
        found = self.calls(method, path)
        assert found, f"no {method} {path} among {[(r.method, r.url.path) for r in self.requests]}"
        return found[-1]

    def with_sandbox(self) -> FakeAPI:
        """Routes to create, get and kill sandbox sb-1."""
        return (
            self.on("POST", "/v1/sandboxes", reply(201, SANDBOX))
            .on("GET", "/v1/sandboxes/sb-1", reply(200, SANDBOX))
            .on("DELETE", "/v1/sandboxes/sb-1", reply(204))
        )


def body(request: httpx.Request) -> Any:
    return json.loads(request.content)


class ChunkRecordingTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Records how the request body arrived (chunk by chunk), then delegates to a FakeAPI."""

    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.chunks: dict[tuple[str, str], list[bytes]] = {}  # (method, path) -> last body

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        chunks = self.chunks[(request.method, request.url.path)] = list(request.stream)
        request._content = b"".join(chunks)  # let the route read .content
        return self.api(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        chunks = [chunk async for chunk in request.stream]
        self.chunks[(request.method, request.url.path)] = chunks
        request._content = b"".join(chunks)
        return self.api(request)
