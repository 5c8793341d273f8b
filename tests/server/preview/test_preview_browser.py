"""Sandbox ports on their own origin in a real browser (Debian's Chromium, tests/server/
browser.py) against a real uvicorn over the in-memory host: a signed URL opens the app, whose
page then POSTs and opens a WebSocket with its access cookie alone; another tenant's page on a
sibling host of the same registrable domain, which the browser sends that cookie along from
(SameSite=Lax), gets neither through. The preview domain is `preview.example.com` (a domain
under a public suffix, as a deployment's is: `*.localhost` hosts are each a site of their
own to Chromium), which the browser resolves to loopback by its own rule, with no DNS.
Both sandboxes' slots are 127.0.0.1, where this module serves the app."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.ports import free_port
from tests.server.browser import Browser, chromium
from tests.server.live import FakeServer, fake_server

DOMAIN = "preview.example.com"

# The app's own page: a POST and a WebSocket to its own origin, with nothing but the cookie.
APP_PAGE = """<!doctype html><title>app</title><link rel="icon" href="data:,">
<pre id="out"></pre><script>
(async () => {
  const out = {};
  const r = await fetch("/echo", {method: "POST", body: "from the page"});
  out.post = `${r.status} ${await r.text()}`;
  out.ws = await new Promise(resolve => {
    const ws = new WebSocket(location.origin.replace("http", "ws") + "/ws");
    ws.onopen = () => ws.send("hello");
    ws.onmessage = e => { resolve(`echo ${e.data}`); ws.close(); };
    ws.onerror = () => resolve("refused");
  });
  const el = document.getElementById("out");
  el.textContent = JSON.stringify(out);
  el.dataset.done = "1";
})();
</script>"""

# Another tenant's page: a no-cors POST (a simple request: no preflight, cookies included)
# and a WebSocket to the origin in its fragment, whose cookie the browser holds.
SIBLING_PAGE = """<!doctype html><title>sibling</title><link rel="icon" href="data:,">
<pre id="out"></pre><script>
(async () => {
  const target = decodeURIComponent(location.hash.slice(1));
  const out = {};
  await fetch(target + "/echo", {method: "POST", mode: "no-cors", credentials: "include",
                                 body: "forged"});
  out.ws = await new Promise(resolve => {
    const ws = new WebSocket(target.replace("http", "ws") + "/ws");
    ws.onopen = () => ws.send("forged");
    ws.onmessage = () => { resolve("open"); ws.close(); };
    ws.onerror = () => resolve("refused");
  });
  const el = document.getElementById("out");
  el.textContent = JSON.stringify(out);
  el.dataset.done = "1";
})();
</script>"""

received: list[str] = []  # what reached the app: "POST body", "WS message"


async def app_page(request: Request) -> HTMLResponse:
    return HTMLResponse(APP_PAGE)


async def sibling_page(request: Request) -> HTMLResponse:
    return HTMLResponse(SIBLING_PAGE)


async def echo(request: Request) -> PlainTextResponse:
    body = (await request.body()).decode()
    received.append(f"POST {body}")
    return PlainTextResponse(body, status_code=201)


async def echo_ws(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            message = await websocket.receive_text()
            received.append(f"WS {message}")
            await websocket.send_text(message)
    except WebSocketDisconnect:
        pass


@pytest.fixture(scope="module")
def app_port() -> Iterator[int]:
    """The app both sandboxes serve, on a loopback socket of this module."""
    app = Starlette(routes=[Route("/", app_page), Route("/sibling", sibling_page),
                            Route("/echo", echo, methods=["POST"]),
                            WebSocketRoute("/ws", echo_ws)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not start"
        time.sleep(0.02)
    yield int(sock.getsockname()[1])
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServer]:
    preview = free_port()
    with fake_server(tmp_path_factory.mktemp("preview"), fake_ns_ip="127.0.0.1",
                     preview_port=preview, preview_url=f"http://{DOMAIN}:{preview}") as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(resolve_to_loopback=f"*.{DOMAIN}") as b:
        yield b


def signed_url(srv: FakeServer, port: int) -> str:
    with httpx.Client(base_url=srv.url, headers=srv.headers(), timeout=30) as http:
        r = http.post("/v1/sandboxes", json={"ttl_seconds": 600})
        assert r.status_code == 201, r.text
        r = http.post(f"/v1/sandboxes/{r.json()['id']}/ports/{port}/signed-url", json={})
        assert r.status_code == 200, r.text
        url: str = r.json()["url"]
        return url


def results(browser: Browser) -> dict[str, str]:
    out = browser.page.wait_for_selector("#out[data-done]", timeout=30_000)
    assert out is not None
    found: dict[str, str] = json.loads(out.inner_text())
    return found


def test_the_apps_own_page_and_not_a_siblings(server: FakeServer, app_port: int,
                                              browser: Browser) -> None:
    page = browser.page
    app = signed_url(server, app_port)
    page.goto(app)
    assert results(browser) == {"post": "201 from the page", "ws": "echo hello"}
    assert received == ["POST from the page", "WS hello"]
    assert not browser.errors, browser.errors

    sibling = urlsplit(signed_url(server, app_port))
    app_origin = f"http://{urlsplit(app).netloc}"
    page.goto(f"http://{sibling.netloc}/sibling?{sibling.query}#{quote(app_origin, safe='')}")
    assert results(browser) == {"ws": "refused"}
    # The POST's answer is opaque to the page; the app is what says it never came.
    assert received == ["POST from the page", "WS hello"]
