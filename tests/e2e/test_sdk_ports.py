"""Exposed ports and the egress policy through the public SDK against a live server (one
VM): `get_url` with the key, `signed_url` without it, `network()` / `update_network()`."""

from __future__ import annotations

import time

import httpx
import pytest

from pandastack import InvalidRequestError, NotFoundError, Sandbox
from tests.e2e.conftest import LiveServer
from tests.sdk_credentials import Credentials

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


def test_ports_and_network(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    with Sandbox.create(ttl_seconds=300, network={"internet": False}, **creds) as sbx:
        assert sbx.network().internet is False
        policy = sbx.update_network({"internet": True, "deny_out": ["198.18.0.0/15"]})
        assert policy.internet is True and policy.deny_out == ["198.18.0.0/15"]
        assert sbx.network() == policy
        with pytest.raises(InvalidRequestError):
            sbx.update_network({"allow_out": ["no such thing!"]})

        sbx.filesystem.write("/tmp/index.html", "<p>hi</p>")
        sbx.commands.start(["python3", "-m", "http.server", "8000"], cwd="/tmp")
        url = sbx.get_url(8000)
        assert url == f"{live_server.api_url}/v1/sandboxes/{sbx.id}/ports/8000/"
        auth = {"Authorization": f"Bearer {live_server.api_key}"}
        deadline = time.monotonic() + 30
        while True:  # bounded wait for the server in the sandbox to listen
            r = httpx.get(url + "index.html", headers=auth, timeout=10)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "<p>hi</p>"
        assert httpx.get(url, timeout=10).status_code == 401

        signed = sbx.signed_url(8000, ttl_seconds=60)  # on the port's own origin
        assert signed.startswith(f"http://8000-{sbx.id}.localhost:{live_server.preview_port}/?")
        address, host = live_server.preview(signed)
        base, _, query = address.partition("?")
        r = httpx.get(f"{base}index.html?{query}", headers=host, timeout=10)
        assert r.status_code == 200 and r.text == "<p>hi</p>"
        with pytest.raises(InvalidRequestError):
            sbx.get_url(0)
    with pytest.raises(NotFoundError):
        Sandbox.connect("sbx-000000000000", **creds)
