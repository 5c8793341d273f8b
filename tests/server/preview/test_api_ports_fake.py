"""Egress policy routes, the port proxy and signed URLs over the in-memory runtime. The fake
runtime's slot points at a loopback HTTP server this module starts (network safety: nothing
leaves loopback; policy names are resolved by the offline test DNS)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.ports import free_port
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.live import fake_server
from tests.server.preview_client import preview_client

# A sandbox's Set-Cookie headers, and what a browser gets of each: no Domain attribute in any
# spelling a browser would read as one (RFC 6265 5.2 trims the name around its `=`).
COOKIES_SENT = ("x=1; Domain =example.com", "y=2; Path=/; DOMAIN\t= example.com; HttpOnly",
                "z=3;domain=.example.com;Secure", "w=4; Domain", "domain=5; Path=/")
COOKIES_KEPT = ("x=1", "y=2; Path=/; HttpOnly", "z=3;Secure", "w=4", "domain=5; Path=/")


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        if self.path.startswith("/slow"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"5\r\nfirst\r\n")
            self.wfile.flush()
            Echo.release.wait(10)
            self.wfile.write(b"6\r\nsecond\r\n0\r\n\r\n")
            return
        if self.path.startswith("/cookies"):
            self.send_response(204)
            for value in COOKIES_SENT:
                self.send_header("Set-Cookie", value)
            self.end_headers()
            return
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        reply = json.dumps({"method": self.command, "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body.decode()}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.send_header("Set-Cookie", "a=1")
        self.send_header("Set-Cookie", "b=2")
        self.send_header("Keep-Alive", "timeout=5")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    Echo.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    runtime = FakeRuntime(tmp_path / "sandboxes")
    runtime.ns_ip = "127.0.0.1"
    async with running_app(make_settings(tmp_path, max_body_bytes=8192), runtime) as a:
        yield a


async def new_sandbox(api: Api, **body: object) -> str:
    r = await api.client.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


# -- network policy ------------------------------------------------------------------------

async def test_network_policy_routes(api: Api) -> None:
    c = api.client
    sid = await new_sandbox(api, network={"internet": False, "allow_out": ["9.9.0.0/16"]})
    r = await c.get(f"/v1/sandboxes/{sid}/network")
    assert r.json() == {"internet": False, "allow_out": ["9.9.0.0/16"], "deny_out": []}
    r = await c.patch(f"/v1/sandboxes/{sid}/network", json={"deny_out": ["pkg.test"]})
    assert r.json() == {"internet": False, "allow_out": ["9.9.0.0/16"], "deny_out": ["pkg.test"]}
    r = await c.put(f"/v1/sandboxes/{sid}/network", json={"allow_out": ["1.2.3.4"]})
    assert r.json() == {"internet": True, "allow_out": ["1.2.3.4"], "deny_out": []}
    assert (await c.get(f"/v1/sandboxes/{sid}/network")).json() == r.json()
    default = await new_sandbox(api)
    r = await c.get(f"/v1/sandboxes/{default}/network")
    assert r.json() == {"internet": True, "allow_out": [], "deny_out": []}

    for bad in ({"allow_out": ["not a name!"]},
                {"deny_out": ["::1/128"]}, {"allow_out": ["1.1.1.1"] * 257},
                {"internet": "maybe"}, {"other": 1}):
        assert_envelope(await c.put(f"/v1/sandboxes/{sid}/network", json=bad), 422,
                        "validation_error")
        assert_envelope(await c.post("/v1/sandboxes", json={"network": bad}), 422,
                        "validation_error")
    assert (await c.get(f"/v1/sandboxes/{sid}/network")).json()["allow_out"] == ["1.2.3.4"]

    other = api.headers(await api.new_key("other-team"))
    assert_envelope(await c.get(f"/v1/sandboxes/{sid}/network", headers=other), 404)
    assert_envelope(await c.put(f"/v1/sandboxes/{sid}/network", json={}, headers=other), 404)

    # fork children inherit the parent's policy
    r = await c.post(f"/v1/sandboxes/{sid}/fork", json={"count": 1})
    child = r.json()["sandboxes"][0]["id"]
    assert (await c.get(f"/v1/sandboxes/{child}/network")).json()["allow_out"] == ["1.2.3.4"]

    await c.delete(f"/v1/sandboxes/{sid}")
    assert_envelope(await c.get(f"/v1/sandboxes/{sid}/network"), 409, "conflict")


# -- the proxy -----------------------------------------------------------------------------

async def test_proxy_with_the_api_key(api: Api, upstream: int) -> None:
    c = api.client
    sid = await new_sandbox(api)
    base = f"/v1/sandboxes/{sid}/ports/{upstream}"
    before = (await c.get(f"/v1/sandboxes/{sid}/lifecycle")).json()["last_activity_at"]
    r = await c.get(f"{base}/some/p%2Fath?x=1&y=%20z", headers={"X-Custom": "v"})
    assert r.status_code == 200, r.text
    seen = r.json()
    assert seen["method"] == "GET" and seen["path"] == "/some/p%2Fath?x=1&y=%20z"
    assert seen["headers"]["x-custom"] == "v"
    assert "authorization" not in seen["headers"]
    assert seen["headers"]["x-forwarded-prefix"] == base
    assert "keep-alive" not in r.headers
    # The API's origin: no cookie either way, pages in an opaque origin, no service worker.
    r = await c.get(f"{base}/", headers={"Cookie": "session=secret"})
    assert "cookie" not in r.json()["headers"] and "set-cookie" not in r.headers
    assert r.headers["content-security-policy"].startswith("sandbox allow-scripts")
    assert_envelope(await c.get(f"{base}/sw.js", headers={"Service-Worker": "script"}), 403,
                    "forbidden")
    after = (await c.get(f"/v1/sandboxes/{sid}/lifecycle")).json()["last_activity_at"]
    assert after > before

    r = await c.post(f"{base}/", content=b"x" * 20000)  # over the JSON limit: streamed on
    assert r.status_code == 201 and r.json()["body"] == "x" * 20000
    r = await c.head(f"{base}/")
    assert r.status_code == 200 and r.content == b""
    assert_envelope(await c.post(f"/v1/sandboxes/{sid}/ports/{upstream}/signed-url",
                                 content=b"{" + b" " * 10000 + b"}"), 413)

    assert_envelope(await c.get(f"{base}/", headers={"Authorization": ""}), 401)
    other = api.headers(await api.new_key("other-team"))
    assert_envelope(await c.get(f"{base}/", headers=other), 404, "not_found")
    assert_envelope(await c.get(f"/v1/sandboxes/{sid}/ports/0/"), 422)
    assert_envelope(await c.get(f"/v1/sandboxes/{sid}/ports/{free_port()}/"), 502,
                    "bad_gateway")
    await c.post(f"/v1/sandboxes/{sid}/pause")
    assert_envelope(await c.get(f"{base}/"), 409, "conflict")
    await c.post(f"/v1/sandboxes/{sid}/hibernate")
    assert (await c.get(f"{base}/")).status_code == 200  # woken by the request
    assert (await c.get(f"/v1/sandboxes/{sid}")).json()["state"] == "running"


async def test_no_network_is_a_conflict(tmp_path: Path) -> None:
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path / "s")) as api:
        sid = await new_sandbox(api)
        assert_envelope(await api.client.get(f"/v1/sandboxes/{sid}/ports/80/"), 409)


async def test_signed_urls_are_served_on_the_ports_own_origin(api: Api, upstream: int) -> None:
    c = api.client
    sid = await new_sandbox(api)
    r = await c.post(f"/v1/sandboxes/{sid}/ports/{upstream}/signed-url",
                     json={"ttl_seconds": 60})
    assert r.status_code == 200, r.text
    signed = r.json()
    assert time.time() + 55 < signed["expires_at"] <= time.time() + 61
    parts = urlsplit(signed["url"])
    host = f"{upstream}-{sid}.localhost"
    assert (parts.scheme, parts.hostname, parts.port, parts.path) == (
        "http", host, api.app.state.settings.preview_listener_port, "/")
    # On the API's origin a signed URL is refused: it would share the API's origin.
    assert_envelope(await c.get(f"/v1/sandboxes/{sid}/ports/{upstream}/?{parts.query}",
                                headers={"Authorization": ""}), 403, "forbidden")

    async with preview_client(api, host) as browser:
        r = await browser.get(f"/x?{parts.query}&keep=1", headers={"Cookie": "mine=1"})
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["path"] == "/x?keep=1"  # ps_expires / ps_sig are not forwarded
        assert seen["headers"]["cookie"] == "mine=1"  # the page's own cookies are
        assert "x-forwarded-prefix" not in seen["headers"]
        access = [v for v in r.headers.get_list("set-cookie") if v.startswith("ps_access=")]
        assert len(access) == 1 and "HttpOnly" in access[0] and "SameSite=Lax" in access[0]
        assert "domain" not in access[0].lower()
        # Its own cookies come back (host-only); the access cookie lets the page's next
        # requests in with no parameters, and is not forwarded.
        assert {"a=1", "b=2"} <= set(r.headers.get_list("set-cookie"))
        r = await browser.get("/next")
        assert r.status_code == 200, r.text
        assert "ps_access" not in r.json()["headers"].get("cookie", "")
        encoded = parts.query.replace("ps_sig", "ps%5Fsig").replace("ps_expires",
                                                                     "ps%5Fexpires")
        r = await browser.get(f"/x?{encoded}&keep=1")
        assert r.json()["path"] == "/x?keep=1"  # nor under an encoded spelling of their names

    params = dict(p.split("=") for p in parts.query.split("&"))
    tampered = params["ps_sig"][:-1] + ("0" if params["ps_sig"][-1] != "0" else "1")
    async with preview_client(api, host) as anonymous:
        for query in (f"ps_expires={params['ps_expires']}&ps_sig={tampered}",
                      f"ps_expires={int(params['ps_expires']) + 1}&ps_sig={params['ps_sig']}",
                      f"ps_sig={params['ps_sig']}", f"{parts.query}&ps_sig=00"):
            assert_envelope(await anonymous.get(f"/?{query}"), 403, "forbidden")
        assert_envelope(await anonymous.get("/"), 401, "unauthorized")
        # A cookie for this port opens nothing else: another port, another sandbox.
        cookie = {"Cookie": f"ps_access={params['ps_expires']}.{params['ps_sig']}"}
        assert (await anonymous.get("/", headers=cookie)).status_code == 200
    async with preview_client(api, f"{upstream + 1}-{sid}.localhost") as other_port:
        assert_envelope(await other_port.get("/", headers=cookie), 403, "forbidden")
        assert_envelope(await other_port.get(f"/?{parts.query}"), 403, "forbidden")
    async with preview_client(api, f"{upstream}-{sid}.elsewhere.test") as wrong_domain:
        assert_envelope(await wrong_domain.get(f"/?{parts.query}"), 404, "not_found")
    async with preview_client(api, host) as keyed:  # a program may use its API key
        r = await keyed.get("/k", headers=api.headers())
        assert r.status_code == 200 and "authorization" not in r.json()["headers"]
        other = api.headers(await api.new_key("other-team"))
        assert_envelope(await keyed.get("/k", headers=other), 404, "not_found")
        # The API's own routes are not on the preview listener: a path there is the
        # sandbox server's, and a host that names no sandbox port is nothing.
        r = await keyed.get("/v1/sandboxes", headers=api.headers())
        assert r.json()["path"] == "/v1/sandboxes"
    async with preview_client(api, "localhost") as bare:
        assert_envelope(await bare.get("/v1/sandboxes", headers=api.headers()), 404,
                        "not_found")

    signer = api.app.state.port_proxy.signer
    expires, sig = signer.sign(sid, upstream, 1, now=time.time() - 10)
    async with preview_client(api, host) as late:
        r = await late.get(f"/?ps_expires={expires}&ps_sig={sig}")
        assert_envelope(r, 403, "forbidden")
        assert "expired" in r.json()["error"]["message"]

    other = api.headers(await api.new_key("other-team-2"))
    assert_envelope(await c.post(f"/v1/sandboxes/{sid}/ports/{upstream}/signed-url",
                                 json={}, headers=other), 404)
    assert_envelope(await c.post(f"/v1/sandboxes/{sid}/ports/{upstream}/signed-url",
                                 json={"ttl_seconds": 0}), 422)
    await c.delete(f"/v1/sandboxes/{sid}")
    async with preview_client(api, host) as after:
        assert_envelope(await after.get(f"/?{parts.query}"), 409)


async def test_the_access_cookie_opens_writes_only_from_the_ports_own_origin(
        api: Api, upstream: int) -> None:
    """Pages of every sandbox share a registrable domain, so SameSite=Lax sends one port's
    access cookie along with another's page's requests: a write needs this port's Origin."""
    sid = await new_sandbox(api)
    other_sid = await new_sandbox(api)
    url = (await api.client.post(f"/v1/sandboxes/{sid}/ports/{upstream}/signed-url",
                                 json={})).json()["url"]
    parts = urlsplit(url)
    assert parts.hostname is not None
    own = f"http://{parts.netloc}"
    listener = parts.port
    params = dict(p.split("=") for p in parts.query.split("&"))
    cookie = {"Cookie": f"ps_access={params['ps_expires']}.{params['ps_sig']}"}
    async with preview_client(api, parts.hostname) as browser:
        # Reads are open to the cookie whatever sent them: no one else can read the answer.
        for method in ("GET", "HEAD", "OPTIONS"):
            r = await browser.request(method, "/", headers={
                **cookie, "Origin": f"http://{upstream + 1}-{sid}.localhost:{listener}"})
            assert r.status_code == 200, (method, r.text)
        r = await browser.post("/", headers={**cookie, "Origin": own}, content=b"mine")
        assert r.status_code == 201 and r.json()["body"] == "mine"
        r = await browser.post("/", headers={**cookie, "Origin": "null",
                                             "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 201, r.text
        for origin in (None, "null", f"http://{upstream + 1}-{sid}.localhost:{listener}",
                       f"http://{upstream}-{other_sid}.localhost:{listener}",
                       f"http://{upstream}-{sid}.localhost:{listener + 1}",
                       f"https://{upstream}-{sid}.localhost:{listener}",
                       f"http://{upstream}-{sid}.localhost", f"{own}/path",
                       f"http://localhost:{listener}", "http://[::1", "garbage"):
            headers = cookie if origin is None else {**cookie, "Origin": origin}
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                r = await browser.request(method, "/", headers=headers)
                assert_envelope(r, 403, "forbidden")
                assert "Origin" in r.json()["error"]["message"], r.text
        r = await browser.post("/", headers={**cookie, "Origin": "null",
                                             "Sec-Fetch-Site": "same-site"})
        assert_envelope(r, 403, "forbidden")
        # Through a port forward the browser's port is the Host header's, not the URL's.
        forwarded = {**cookie, "Host": f"{parts.hostname}:9999"}
        r = await browser.post("/", headers={**forwarded,
                                             "Origin": f"http://{parts.hostname}:9999"})
        assert r.status_code == 201, r.text
        r = await browser.post("/", headers={**forwarded,
                                             "Origin": f"http://{parts.hostname}:9998"})
        assert_envelope(r, 403, "forbidden")
        # What a program has instead: the signed URL itself, or its key (the cookie
        # beside either changes nothing).
        for headers in ({}, cookie):
            r = await browser.post(f"/?{parts.query}", headers=headers)
            assert r.status_code == 201, r.text
        r = await browser.post("/", headers={**cookie, **api.headers(),
                                             "Origin": "http://evil.localhost"})
        assert r.status_code == 201, r.text


async def test_set_cookie_loses_domain_as_browsers_parse_it(api: Api, upstream: int) -> None:
    sid = await new_sandbox(api)
    async with preview_client(api, f"{upstream}-{sid}.localhost") as keyed:
        r = await keyed.get("/cookies", headers=api.headers())
        assert r.status_code == 204, r.text
        assert tuple(r.headers.get_list("set-cookie")) == COOKIES_KEPT


async def test_a_server_without_a_preview_listener_signs_no_url(tmp_path: Path) -> None:
    async with running_app(make_settings(tmp_path, preview_port=0),
                           FakeRuntime(tmp_path / "s")) as api:
        sid = await new_sandbox(api)
        assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/ports/80/signed-url",
                                              json={}), 409, "conflict")


async def test_signing_key_is_kept_in_the_database(tmp_path: Path, upstream: int) -> None:
    settings = make_settings(tmp_path)
    runtime = FakeRuntime(tmp_path / "s")
    runtime.ns_ip = "127.0.0.1"
    async with running_app(settings, runtime) as api:
        sid = await new_sandbox(api)
        url = (await api.client.post(f"/v1/sandboxes/{sid}/ports/{upstream}/signed-url",
                                     json={})).json()["url"]
    async with running_app(settings, runtime) as api:  # a restart: the same key
        parts = urlsplit(url)
        assert parts.hostname is not None
        async with preview_client(api, parts.hostname) as browser:
            r = await browser.get(f"/?{parts.query}")
            assert r.status_code == 200, r.text


def test_responses_stream(tmp_path: Path, upstream: int) -> None:
    """Through a real uvicorn: the first chunk arrives while the upstream holds the rest."""
    Echo.release.clear()
    with fake_server(tmp_path, fake_ns_ip="127.0.0.1") as srv, \
            httpx.Client(base_url=srv.url, headers=srv.headers(), timeout=10) as client:
        sid = client.post("/v1/sandboxes", json={}).json()["id"]
        with client.stream("GET", f"/v1/sandboxes/{sid}/ports/{upstream}/slow") as r:
            assert r.status_code == 200
            chunks = r.iter_raw()
            assert next(chunks) == b"first"
            Echo.release.set()
            assert b"".join(chunks) == b"second"
        assert "Traceback" not in srv.log_tail()
