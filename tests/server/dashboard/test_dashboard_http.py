"""The dashboard over HTTP, against the in-memory host: sign-in and its cookie, the CSRF token
and Origin checks, sessions that end with their key, admin-only keys, and team scoping of
what the dashboard forwards to the API (docs/adr/0034-dashboard.md). The browser tests are
test_dashboard_browser.py and tests/e2e/test_dashboard.py."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from pandastack.server.dashboard.session import (
    COOKIE,
    SECURE_COOKIE,
    SESSION_SECONDS,
    SessionSigner,
)
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.live import fake_server


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path)) as a:
        yield a


def browser(api: Api, base_url: str = "http://test") -> httpx.AsyncClient:
    """A client with no API key, as a browser is: only cookies."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(api.app), base_url=base_url)


async def sign_in(client: httpx.AsyncClient, key: str) -> str:
    """Signs in; returns the session's CSRF token."""
    r = await client.post("/dashboard/login", json={"key": key})
    assert r.status_code == 200, r.text
    token: str = r.json()["csrf_token"]
    return token


async def key_id(api: Api, key: str) -> str:
    listed = (await api.client.get("/v1/keys")).json()["keys"]
    found: str = next(k["id"] for k in listed if key.startswith(k["prefix"]))
    return found


async def test_without_a_session_pages_redirect_and_the_api_is_401(api: Api) -> None:
    async with browser(api) as client:
        r = await client.get("/dashboard")
        assert r.status_code == 307 and r.headers["location"] == "/dashboard/"
        r = await client.get("/dashboard/")
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
        r = await client.get("/dashboard/login")
        assert r.status_code == 200 and "API key" in r.text
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert_envelope(await client.get("/dashboard/api/v1/sandboxes"), 401, "unauthorized")
        assert_envelope(await client.get("/dashboard/session"), 401, "unauthorized")
        # A forged or tampered cookie is no session either.
        client.cookies.set(COOKIE, "key_0123456789abcdef.9999999999.0011223344556677." + "0" * 64)
        assert_envelope(await client.get("/dashboard/api/v1/sandboxes"), 401, "unauthorized")
        assert (await client.get("/dashboard/")).status_code == 303
        # The static assets are public (the sign-in page needs them) and only those named.
        assert (await client.get("/dashboard/static/app.js")).status_code == 200
        assert (await client.get("/dashboard/static/vendor/xterm.js")).status_code == 200
        assert (await client.get("/dashboard/static/../session.py")).status_code == 404
        assert (await client.get("/dashboard/static/session.py")).status_code == 404


async def test_sign_in_sets_a_strict_http_only_cookie_without_the_key(api: Api) -> None:
    async with browser(api) as client:
        assert_envelope(await client.post("/dashboard/login", json={"key": "psk_nope"}),
                        401, "unauthorized")
        r = await client.post("/dashboard/login", json={"key": api.admin_key})
        assert r.status_code == 200, r.text
        cookie = r.headers["set-cookie"]
        attrs = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "path", "max-age"} <= attrs and "secure" not in attrs, cookie
        assert "samesite=strict" in cookie.lower() and "path=/;" in cookie.lower() + ";"
        assert f"max-age={SESSION_SECONDS}" in cookie.lower()
        value = client.cookies[COOKIE]
        assert api.admin_key not in value and api.admin_key[4:] not in value
        assert value.startswith(await key_id(api, api.admin_key) + ".")
        assert r.json()["admin"] is True and r.json()["team"] == "default"
        assert (await client.get("/dashboard/")).status_code == 200
        # The REST API itself never takes the cookie.
        assert_envelope(await client.get("/v1/sandboxes"), 401, "unauthorized")
    async with browser(api, "https://test") as client:
        r = await client.post("/dashboard/login", json={"key": api.admin_key})
        assert "secure" in {p.strip().lower() for p in r.headers["set-cookie"].split(";")}


def cookie_attributes(set_cookie: str) -> dict[str, str]:
    return {name.strip().lower(): value.strip() for name, _, value in
            (part.partition("=") for part in set_cookie.split(";")[1:])}


async def test_over_https_the_session_cookie_is_host_only(api: Api, tmp_path: Path) -> None:
    """A sandbox's page on a sibling host of the same parent domain can set a cookie for that
    domain: over https the session is a `__Host-` cookie, which a browser takes only from
    this host (Secure, Path=/, no Domain), and a plain one is no session there."""
    async with browser(api) as plain:
        await sign_in(plain, api.admin_key)
        planted = plain.cookies[COOKIE]  # a valid session: the planter's own
    async with browser(api, "https://test") as client:
        r = await client.post("/dashboard/login", json={"key": api.admin_key})
        assert r.status_code == 200, r.text
        name, _, _ = r.headers["set-cookie"].partition("=")
        attributes = cookie_attributes(r.headers["set-cookie"])
        assert name == SECURE_COOKIE, r.headers["set-cookie"]
        assert "secure" in attributes and attributes["path"] == "/"
        assert "domain" not in attributes
        assert (await client.get("/dashboard/session")).status_code == 200
        # Signing out deletes the cookie of the same name.
        token = r.json()["csrf_token"]
        r = await client.post("/dashboard/logout", headers={"X-CSRF-Token": token})
        assert r.status_code == 204 and r.headers["set-cookie"].startswith(SECURE_COOKIE + "=")
    async with browser(api, "https://test") as fixated:
        fixated.cookies.set(COOKIE, planted)
        assert_envelope(await fixated.get("/dashboard/session"), 401, "unauthorized")
        assert (await fixated.get("/dashboard/")).status_code == 303
    # Behind a TLS proxy the request itself is http: the public URL says https.
    settings = make_settings(tmp_path / "proxied", public_url="https://api.example.test")
    async with running_app(settings, FakeRuntime(tmp_path / "proxied")) as proxied, \
            browser(proxied) as client:
        r = await client.post("/dashboard/login", json={"key": proxied.admin_key})
        assert r.status_code == 200, r.text
        assert r.headers["set-cookie"].startswith(SECURE_COOKIE + "=")
        assert "secure" in cookie_attributes(r.headers["set-cookie"])


async def test_login_csrf_is_refused(api: Api) -> None:
    async with browser(api) as client:
        r = await client.post("/dashboard/login", json={"key": api.admin_key},
                              headers={"Origin": "https://evil.example"})
        assert_envelope(r, 403, "forbidden")
        r = await client.post("/dashboard/login", json={"key": api.admin_key},
                              headers={"Sec-Fetch-Site": "cross-site"})
        assert_envelope(r, 403, "forbidden")
        # What a cross-site HTML form can send: not JSON.
        r = await client.post("/dashboard/login", data={"key": api.admin_key})
        assert r.status_code == 415
        assert COOKIE not in client.cookies
        r = await client.post("/dashboard/login", json={"key": api.admin_key},
                              headers={"Origin": "http://test"})
        assert r.status_code == 200


async def test_every_api_call_needs_the_sessions_csrf_token(api: Api) -> None:
    async with browser(api) as client, browser(api) as other:
        token = await sign_in(client, api.admin_key)
        other_token = await sign_in(other, api.admin_key)
        assert token != other_token
        r = await client.post("/dashboard/api/v1/sandboxes", json={})
        assert_envelope(r, 403, "forbidden")
        for bad in ("", "0" * 64, other_token):
            r = await client.post("/dashboard/api/v1/sandboxes", json={},
                                  headers={"X-CSRF-Token": bad})
            assert_envelope(r, 403, "forbidden")
        # Even reads: some wake a hibernated sandbox.
        assert_envelope(await client.get("/dashboard/api/v1/sandboxes"), 403, "forbidden")
        r = await client.post("/dashboard/api/v1/sandboxes", json={},
                              headers={"X-CSRF-Token": token, "Origin": "https://evil.example"})
        assert_envelope(r, 403, "forbidden")
        assert (await api.client.get("/v1/sandboxes")).json()["sandboxes"] == []
        r = await client.post("/dashboard/api/v1/sandboxes", json={"metadata": {"by": "ui"}},
                              headers={"X-CSRF-Token": token, "Origin": "http://test"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert "x-request-id" in r.headers
        r = await client.delete(f"/dashboard/api/v1/sandboxes/{sid}",
                                headers={"X-CSRF-Token": token})
        assert r.status_code == 204
        # Sign-out needs the token too, then the cookie is gone.
        assert_envelope(await client.post("/dashboard/logout"), 403, "forbidden")
        r = await client.post("/dashboard/logout", headers={"X-CSRF-Token": token})
        assert r.status_code == 204 and COOKIE not in client.cookies
        assert_envelope(await client.get("/dashboard/session"), 401, "unauthorized")


async def test_a_session_ends_with_its_key(api: Api) -> None:
    key = await api.new_key("acme")
    async with browser(api) as client:
        token = await sign_in(client, key)
        headers = {"X-CSRF-Token": token}
        assert (await client.get("/dashboard/api/v1/sandboxes", headers=headers)).status_code \
            == 200
        r = await api.client.delete(f"/v1/keys/{await key_id(api, key)}")
        assert r.status_code == 204
        assert_envelope(await client.get("/dashboard/api/v1/sandboxes", headers=headers),
                        401, "unauthorized")
        assert (await client.get("/dashboard/")).status_code == 303
        assert_envelope(await client.post("/dashboard/login", json={"key": key}),
                        401, "unauthorized")


async def test_a_non_admin_key_gets_no_keys(api: Api) -> None:
    key = await api.new_key("acme")
    async with browser(api) as client:
        token = await sign_in(client, key)
        info = (await client.get("/dashboard/session")).json()
        assert info["admin"] is False and info["team"] == "acme"
        headers = {"X-CSRF-Token": token}
        assert_envelope(await client.get("/dashboard/api/v1/keys", headers=headers),
                        403, "forbidden")
        assert_envelope(await client.post("/dashboard/api/v1/keys", json={"name": "x"},
                                          headers=headers), 403, "forbidden")
        admin_id = await key_id(api, api.admin_key)
        assert_envelope(await client.delete(f"/dashboard/api/v1/keys/{admin_id}",
                                            headers=headers), 403, "forbidden")
    listed = (await api.client.get("/v1/keys")).json()["keys"]
    assert len(listed) == 2 and not any(k["revoked"] for k in listed)


async def test_a_team_sees_only_its_own_sandboxes(api: Api) -> None:
    acme, other = await api.new_key("acme"), await api.new_key("other")
    r = await api.client.post("/v1/sandboxes", json={}, headers=api.headers(acme))
    sid = r.json()["id"]
    async with browser(api) as client:
        headers = {"X-CSRF-Token": await sign_in(client, other)}
        listed = await client.get("/dashboard/api/v1/sandboxes", headers=headers)
        assert listed.status_code == 200 and listed.json()["sandboxes"] == []
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/pause"),
                             ("GET", "/files/list?path=/"), ("GET", "/logs")):
            r = await client.request(method, f"/dashboard/api/v1/sandboxes/{sid}{path}",
                                     headers=headers)
            assert_envelope(r, 404, "not_found")
    async with browser(api) as client:
        headers = {"X-CSRF-Token": await sign_in(client, acme)}
        listed = await client.get("/dashboard/api/v1/sandboxes", headers=headers)
        assert [s["id"] for s in listed.json()["sandboxes"]] == [sid]
        # The port proxy's path form would put a sandbox's page on the dashboard's origin.
        r = await client.get(f"/dashboard/api/v1/sandboxes/{sid}/ports/8000/", headers=headers)
        assert_envelope(r, 404, "not_found")
        assert_envelope(await client.get("/dashboard/api/health", headers=headers),
                        404, "not_found")
    r = await api.client.get(f"/v1/sandboxes/{sid}", headers=api.headers(acme))
    assert r.json()["state"] == "running"
    r = await api.client.delete(f"/v1/sandboxes/{sid}", headers=api.headers(acme))
    assert r.status_code == 204


async def test_the_terminal_socket_needs_a_session_and_this_origin(tmp_path: Path) -> None:
    with fake_server(tmp_path) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            r = await http.post("/v1/sandboxes", json={}, headers=srv.headers())
            sid = r.json()["id"]
            r = await http.post("/dashboard/login", json={"key": srv.admin_key})
            assert r.status_code == 200
            cookie = f"{COOKIE}={http.cookies[COOKIE]}"
            ws = srv.url.replace("http://", "ws://") + f"/dashboard/api/v1/sandboxes/{sid}/pty/7"
            origin = srv.url

            async def status(headers: dict[str, str]) -> int:
                try:
                    async with connect(ws, additional_headers=headers, open_timeout=10):
                        return 101
                except InvalidStatus as exc:
                    bodies.append(bytes(exc.response.body or b""))
                    return exc.response.status_code

            bodies: list[bytes] = []

            assert await status({"Cookie": cookie, "Origin": "https://evil.example"}) == 403
            assert await status({"Cookie": cookie}) == 403  # no Origin: no browser's
            assert await status({"Origin": origin}) == 401
            # Through to the terminal route: the in-memory host has no terminal 7.
            assert await status({"Cookie": cookie, "Origin": origin}) == 404
            assert b"terminal 7" in bodies[-1], bodies[-1]
            r = await http.delete(f"/v1/sandboxes/{sid}", headers=srv.headers())
            assert r.status_code == 204


def test_every_asset_is_package_data() -> None:
    """`pip install` carries only what pyproject's package data names: every file the pages
    load must match one of its globs (a new folder under static/ needs a new one)."""
    root = Path(__file__).resolve().parents[3]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["pandastack"]
    static = root / "src" / "pandastack" / "server" / "dashboard" / "static"
    files = [p.relative_to(root / "src" / "pandastack").as_posix()
             for p in static.rglob("*") if p.is_file()]
    assert "server/dashboard/static/vendor/xterm.js" in files
    missing = [f for f in files if not any(fnmatch.fnmatchcase(f, g) and
                                           f.count("/") == g.count("/") for g in globs)]
    assert not missing, missing


def test_session_cookies_are_signed_bound_and_expire() -> None:
    signer, other = SessionSigner(b"a" * 32), SessionSigner(b"b" * 32)
    session = signer.issue("key_0123456789abcdef", now=1000.0)
    assert signer.check(session.cookie, now=1001.0) == session
    assert signer.check(session.cookie, now=1000.0 + SESSION_SECONDS) is None  # expired
    assert other.check(session.cookie, now=1001.0) is None  # another server's secret
    key, expires, nonce, sig = session.cookie.split(".")
    for forged in (f"key_fedcba9876543210.{expires}.{nonce}.{sig}",  # another key
                   f"{key}.{int(expires) + 86400}.{nonce}.{sig}",  # a longer life
                   f"{key}.{expires}.{nonce}.{sig[:-1]}{'1' if sig[-1] == '0' else '0'}",
                   "", "garbage"):
        assert signer.check(forged, now=1001.0) is None, forged
    token = signer.csrf_token(session)
    assert signer.csrf_ok(session, token)
    assert not signer.csrf_ok(signer.issue(key, now=1000.0), token)  # bound to its cookie
    assert not signer.csrf_ok(session, None) and not signer.csrf_ok(session, token.upper())
