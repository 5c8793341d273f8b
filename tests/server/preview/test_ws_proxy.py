"""WebSockets through the port proxy, on a real uvicorn (the fake runtime's slot points at
127.0.0.1) to a loopback WebSocket server this module starts. Network safety: loopback only."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import Server, ServerConnection, serve
from websockets.typing import Subprotocol

from pandastack.server.preview.wsproxy import close_reason, sendable
from tests.ports import free_port
from tests.server.live import FakeServer, fake_server


def handler(conn: ServerConnection) -> None:
    """Echoes every message; "whoami" is answered with the handshake it saw; on a path
    starting /close it closes at once with 4001."""
    assert conn.request is not None
    if conn.request.path.startswith("/close"):
        conn.close(4001, "bye from upstream")
        return
    try:
        for message in conn:
            if message == "whoami":
                conn.send(json.dumps({
                    "path": conn.request.path, "subprotocol": conn.subprotocol,
                    "headers": {k.lower(): v for k, v in conn.request.headers.raw_items()}}))
            else:
                conn.send(message)
    except ConnectionClosed:
        pass
    seen[conn.request.path] = conn.close_code


seen: dict[str, int | None] = {}  # path -> the close code the echo server got


def pick(conn: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    return Subprotocol("chat") if "chat" in offered else None


@pytest.fixture(scope="module")
def echo() -> Iterator[int]:
    server: Server = serve(handler, "127.0.0.1", 0, select_subprotocol=pick, compression=None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.socket.getsockname()[1])
    server.shutdown()
    thread.join(10)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    with fake_server(tmp_path_factory.mktemp("ws"), fake_ns_ip="127.0.0.1") as s:
        yield s


@pytest.fixture(scope="module")
def http(srv: FakeServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, headers=srv.headers(), timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def sid(http: httpx.Client) -> str:
    r = http.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def ws_url(srv: FakeServer, path: str) -> str:
    return "ws" + srv.url.removeprefix("http") + path


def open_ws(srv: FakeServer, path: str, headers: dict[str, str] | None = None,
            subprotocols: Sequence[Subprotocol] | None = None) -> ClientConnection:
    return connect(ws_url(srv, path), additional_headers=headers, proxy=None,
                   open_timeout=10, close_timeout=5, subprotocols=subprotocols)


def refused(srv: FakeServer, path: str,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    with pytest.raises(InvalidStatus) as info:
        open_ws(srv, path, headers)
    response = info.value.response
    return response.status_code, json.loads(response.body or b"{}")


def test_echo_with_the_api_key(srv: FakeServer, sid: str, echo: int) -> None:
    base = f"/v1/sandboxes/{sid}/ports/{echo}"
    with open_ws(srv, f"{base}/room/a%2Fb?x=1", srv.headers(),
                 subprotocols=[Subprotocol("chat"), Subprotocol("other")]) as ws:
        assert ws.subprotocol == "chat"  # the upstream's choice
        ws.send("hello")
        assert ws.recv(5) == "hello"
        ws.send(b"\x00\x01binary\xff")
        assert ws.recv(5) == b"\x00\x01binary\xff"
        big = b"x" * 300_000
        ws.send(big)
        assert ws.recv(5) == big
        ws.send("whoami")
        info = json.loads(ws.recv(5))
        assert info["path"] == "/room/a%2Fb?x=1"
        assert info["subprotocol"] == "chat"
        headers = info["headers"]
        assert "authorization" not in headers and "x-api-key" not in headers
        assert headers["x-forwarded-prefix"] == base
        assert headers["x-forwarded-proto"] == "http"
        assert headers["host"] == f"127.0.0.1:{echo}"
    assert "Traceback" not in srv.log_tail()


def test_client_close_code_reaches_the_upstream(srv: FakeServer, sid: str, echo: int) -> None:
    with open_ws(srv, f"/v1/sandboxes/{sid}/ports/{echo}/closing", srv.headers()) as ws:
        ws.send("ping")
        assert ws.recv(5) == "ping"
        ws.close(4002, "client done")
    pause = threading.Event()
    for _ in range(50):  # bounded: the proxy closes the upstream just after
        if "/closing" in seen:
            break
        pause.wait(0.1)
    assert seen.get("/closing") == 4002


def test_upstream_close_code_reaches_the_client(srv: FakeServer, sid: str, echo: int) -> None:
    with open_ws(srv, f"/v1/sandboxes/{sid}/ports/{echo}/close", srv.headers()) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(5)
        assert ws.close_code == 4001
        assert ws.close_reason == "bye from upstream"


def open_preview(srv: FakeServer, host: str, path: str,
                 headers: dict[str, str] | None = None) -> ClientConnection:
    """A WebSocket to the preview listener under `host` (a connected loopback socket: the
    URL's host name is what the server routes by, and needs no DNS)."""
    sock = socket.create_connection(("127.0.0.1", srv.preview_port), timeout=10)
    return connect(f"ws://{host}:{srv.preview_port}{path}", sock=sock,
                   additional_headers=headers, proxy=None, open_timeout=10, close_timeout=5)


def test_signed_url_without_a_key(srv: FakeServer, http: httpx.Client, sid: str,
                                  echo: int) -> None:
    r = http.post(f"/v1/sandboxes/{sid}/ports/{echo}/signed-url", json={"ttl_seconds": 60})
    assert r.status_code == 200, r.text
    parts = urlsplit(r.json()["url"])
    host = f"{echo}-{sid}.localhost"
    assert (parts.hostname, parts.port) == (host, srv.preview_port)
    with open_preview(srv, host, f"/chat?{parts.query}&keep=1",
                      {"Cookie": "mine=1"}) as ws:
        ws.send("via signed url")
        assert ws.recv(5) == "via signed url"
        ws.send("whoami")
        info = json.loads(ws.recv(5))
        assert info["path"] == "/chat?keep=1"  # ps_expires / ps_sig are not forwarded
        assert info["headers"]["cookie"] == "mine=1"
    params = dict(p.split("=") for p in parts.query.split("&"))
    access = f"ps_access={params['ps_expires']}.{params['ps_sig']}"
    own = f"http://{host}:{srv.preview_port}"
    with open_preview(srv, host, "/chat", {"Cookie": f"{access}; mine=2",
                                           "Origin": own}) as ws:
        ws.send("whoami")  # the access cookie lets its own page in, and is not forwarded
        assert json.loads(ws.recv(5))["headers"]["cookie"] == "mine=2"
    # Every sandbox's pages share a registrable domain (SameSite=Lax sends the cookie from
    # each): the cookie opens a WebSocket only from its own port's page, and a program (no
    # Origin) needs the signed URL or a key.
    for origin in (f"http://{echo + 1}-{sid}.localhost:{srv.preview_port}", "null", None):
        headers = {"Cookie": access} | ({"Origin": origin} if origin else {})
        with pytest.raises(InvalidStatus) as info_:
            open_preview(srv, host, "/chat", headers)
        assert info_.value.response.status_code == 403, origin
        assert b"Origin" in (info_.value.response.body or b"")
    with open_preview(srv, host, "/chat", {"Cookie": access, **srv.headers()}) as ws:
        ws.send("keyed")
        assert ws.recv(5) == "keyed"

    bad = params["ps_sig"][:-1] + ("0" if params["ps_sig"][-1] != "0" else "1")
    with pytest.raises(InvalidStatus) as info_:
        open_preview(srv, host, f"/?ps_expires={params['ps_expires']}&ps_sig={bad}")
    assert info_.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as info_:  # signed for another port
        open_preview(srv, f"{echo + 1}-{sid}.localhost", f"/?{parts.query}")
    assert info_.value.response.status_code == 403
    # The path form on the API's origin takes an API key only.
    status, body = refused(srv, f"/v1/sandboxes/{sid}/ports/{echo}/?{parts.query}")
    assert status == 403 and body["error"]["code"] == "forbidden"


def test_refused_without_access(srv: FakeServer, http: httpx.Client, sid: str,
                                echo: int) -> None:
    base = f"/v1/sandboxes/{sid}/ports/{echo}/"
    status, body = refused(srv, base)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    r = http.post("/v1/keys", json={"name": "k", "team": "ws-other-team"})
    assert r.status_code == 201, r.text
    other = {"Authorization": f"Bearer {r.json()['key']}"}
    status, body = refused(srv, base, other)
    assert status == 404 and body["error"]["code"] == "not_found"
    status, _ = refused(srv, f"/v1/sandboxes/{sid}/ports/0/", srv.headers())
    assert status == 422
    status, _ = refused(srv, "/v1/sandboxes/sbx-000000000000/ports/80/", srv.headers())
    assert status == 404


def test_upstream_refused_closes_the_client(srv: FakeServer, sid: str) -> None:
    with open_ws(srv, f"/v1/sandboxes/{sid}/ports/{free_port()}/", srv.headers()) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(10)
        assert ws.close_code == 1014
        assert "did not answer" in (ws.close_reason or "")
    assert "Traceback" not in srv.log_tail()


def test_not_a_websocket_server_closes_the_client(srv: FakeServer, http: httpx.Client,
                                                  sid: str) -> None:
    """The API server itself as the "sandbox's" port: it answers HTTP, not a handshake."""
    port = int(urlsplit(srv.url).port or 0)
    with open_ws(srv, f"/v1/sandboxes/{sid}/ports/{port}/health", srv.headers()) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(10)
        assert ws.close_code == 1014


def test_close_codes() -> None:
    assert sendable(None, abnormal=1011) == 1011
    assert sendable(1006, abnormal=1001) == 1001
    assert sendable(1005, abnormal=1011) == 1000
    assert sendable(1004, abnormal=1011) == 1000
    assert sendable(4001, abnormal=1011) == 4001
    assert sendable(1014, abnormal=1011) == 1014
    assert len(close_reason("é" * 200).encode()) <= 123
    assert close_reason("short") == "short"
