"""Exposed ports and the egress policy through the REST API on a real microVM (one VM): a web
server started in the sandbox answers through the API URL with the key, through a signed URL
on its own origin (the preview listener) without it, not after the signed URL expired, and
not to another team. Traffic stays on the
host: the server reaches the guest through the sandbox's namespace address."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.server.conftest import Api, assert_envelope
from tests.server.preview_client import preview_client
from tests.server.vm_app import vm_app

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
async def api(host_mode: str) -> AsyncIterator[Api]:
    async with vm_app(host_mode) as a:
        yield a


async def test_policy_and_exposed_port(api: Api) -> None:
    c = api.client
    r = await c.post("/v1/sandboxes", json={"ttl_seconds": 300, "network": {"internet": False}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        r = await c.get(f"/v1/sandboxes/{sid}/network")
        assert r.json() == {"internet": False, "allow_out": [], "deny_out": []}
        r = await c.patch(f"/v1/sandboxes/{sid}/network", json={"allow_out": ["198.18.0.0/24"]})
        assert r.json() == {"internet": False, "allow_out": ["198.18.0.0/24"], "deny_out": []}
        assert (await c.get(f"/v1/sandboxes/{sid}/network")).json() == r.json()
        assert_envelope(await c.put(f"/v1/sandboxes/{sid}/network",
                                    json={"allow_out": ["bad entry"]}), 422)

        r = await c.post(f"/v1/sandboxes/{sid}/processes",
                         json={"cmd": ["python3", "-m", "http.server", "8000"], "cwd": "/tmp"})
        assert r.status_code == 201, r.text
        await c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/hello.txt"},
                    content=b"hello from the sandbox")
        base = f"/v1/sandboxes/{sid}/ports/8000"
        deadline = time.monotonic() + 30
        while True:  # bounded: the server needs a moment to listen
            r = await c.get(f"{base}/hello.txt")
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            assert r.status_code == 502, r.text
            await asyncio.sleep(0.2)
        assert r.status_code == 200 and r.content == b"hello from the sandbox"
        assert (await c.get(f"{base}/")).status_code == 200  # the directory listing

        anonymous = {"Authorization": ""}
        assert_envelope(await c.get(f"{base}/hello.txt", headers=anonymous), 401)
        r = await c.post(f"{base}/signed-url", json={"ttl_seconds": 60})
        signed = urlsplit(r.json()["url"])
        assert signed.hostname == f"8000-{sid}.localhost"
        async with preview_client(api, signed.hostname) as browser:
            r = await browser.get(f"/hello.txt?{signed.query}")
            assert r.status_code == 200 and r.content == b"hello from the sandbox"
            r = await browser.get("/hello.txt")  # the cookie the first request set
            assert r.status_code == 200 and r.content == b"hello from the sandbox"

        r = await c.post(f"{base}/signed-url", json={"ttl_seconds": 1})
        short = urlsplit(r.json()["url"])
        await asyncio.sleep(2)
        async with preview_client(api, signed.hostname) as late:
            assert_envelope(await late.get(f"/hello.txt?{short.query}"), 403, "forbidden")

        other = api.headers(await api.new_key("ports-other-team"))
        assert_envelope(await c.get(f"{base}/hello.txt", headers=other), 404, "not_found")
        assert_envelope(await c.get(f"/v1/sandboxes/{sid}/ports/8001/"), 502, "bad_gateway")
    finally:
        assert (await c.delete(f"/v1/sandboxes/{sid}")).status_code == 204
