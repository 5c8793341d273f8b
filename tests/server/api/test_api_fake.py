"""The HTTP layer over an in-memory runtime: auth, teams, keys, the error envelope for every
kind of bad input, rate limiting, lifecycle bookkeeping, reconciliation, OpenAPI. Fast."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.server.store import open_store
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime

SPEC = Path(__file__).resolve().parents[3] / "spec" / "openapi.json"


@pytest.fixture
async def api(tmp_path: Path, db: str) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path, db_url=db), FakeRuntime(tmp_path)) as a:
        yield a


async def create(api: Api, **body: object) -> dict[str, object]:
    r = await api.client.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    data: dict[str, object] = r.json()
    return data


async def test_health_and_request_ids(api: Api) -> None:
    r = await api.client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert r.headers["x-request-id"].startswith("req_")
    r2 = await api.client.get("/health")
    assert r2.headers["x-request-id"] != r.headers["x-request-id"]


async def test_first_start_writes_private_client_config(tmp_path: Path, db: str,
                                                        api: Api) -> None:
    path = tmp_path / "client" / "config.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    data = json.loads(path.read_text())
    assert data == {"api_url": "http://127.0.0.1:8080", "api_key": api.admin_key}
    store = open_store(db)
    try:  # only the hash is stored
        assert all(api.admin_key not in (k.hash, k.prefix) for k in store.list_keys())
    finally:
        store.close()


async def test_auth_required(api: Api) -> None:
    c = api.client
    assert_envelope(
        await c.get("/v1/sandboxes", headers={"Authorization": ""}), 401, "unauthorized"
    )
    assert_envelope(
        await c.get("/v1/sandboxes", headers={"Authorization": "Bearer psk_x"}), 401, "unauthorized"
    )
    assert_envelope(await c.get("/v1/sandboxes", headers={"Authorization": "Basic abc"}), 401)
    r = await c.get("/v1/sandboxes", headers={"Authorization": "", "X-API-Key": api.admin_key})
    assert r.status_code == 200


async def test_keys_and_team_isolation(api: Api) -> None:
    c = api.client
    key_b = await api.new_key("team-b", "b")
    sbx = await create(api)
    r = await c.get(f"/v1/sandboxes/{sbx['id']}", headers=api.headers(key_b))
    assert_envelope(r, 404, "not_found")
    assert_envelope(await c.delete(f"/v1/sandboxes/{sbx['id']}", headers=api.headers(key_b)), 404)
    r = await c.get("/v1/sandboxes", headers=api.headers(key_b))
    assert r.json() == {"sandboxes": [], "next_token": None}
    # a non-admin key cannot manage keys
    assert_envelope(await c.get("/v1/keys", headers=api.headers(key_b)), 403, "forbidden")
    keys = (await c.get("/v1/keys")).json()["keys"]
    b = next(k for k in keys if k["team"] == "team-b")
    assert "key" not in b and b["revoked"] is False and key_b.startswith(b["prefix"])
    assert (await c.delete(f"/v1/keys/{b['id']}")).status_code == 204
    assert (await c.delete(f"/v1/keys/{b['id']}")).status_code == 204  # idempotent
    assert_envelope(await c.get("/v1/sandboxes", headers=api.headers(key_b)), 401)
    assert_envelope(await c.delete("/v1/keys/key_nope"), 404)
    assert_envelope(await c.post("/v1/keys", json={"name": "x", "team": "bad team!"}), 400)


async def test_create_list_filter_delete(api: Api) -> None:
    c = api.client
    a = await create(api, metadata={"job": "a"}, ttl_seconds=60)
    b = await create(api, metadata={"job": "b"}, persistent=True)
    assert a["state"] == "running" and a["template"] == "base"
    assert isinstance(a["expires_at"], float) and b["expires_at"] is None
    r = await c.get("/v1/sandboxes", params={"metadata.job": "a"})
    assert [s["id"] for s in r.json()["sandboxes"]] == [a["id"]]
    assert_envelope(
        await c.get("/v1/sandboxes", params={"state": "bogus"}), 422, "validation_error"
    )
    assert (await c.delete(f"/v1/sandboxes/{a['id']}")).status_code == 204
    assert (await c.delete(f"/v1/sandboxes/{a['id']}")).status_code == 204  # idempotent
    info = (await c.get(f"/v1/sandboxes/{a['id']}")).json()
    assert info["state"] == "killed" and info["ended_at"] and info["end_reason"]
    r = await c.get("/v1/sandboxes", params={"state": "running"})
    assert [s["id"] for s in r.json()["sandboxes"]] == [b["id"]]
    # operations on an ended sandbox: 409
    r = await c.post(f"/v1/sandboxes/{a['id']}/exec", json={"cmd": "true"})
    assert_envelope(r, 409, "conflict")
    assert_envelope(await c.patch(f"/v1/sandboxes/{a['id']}/lifecycle", json={}), 409)
    assert_envelope(await c.post("/v1/sandboxes", json={"template": "nope"}), 404, "not_found")
    assert_envelope(await c.post("/v1/sandboxes", json={"snapshot": "s"}), 404, "not_found")
    assert_envelope(await c.post("/v1/sandboxes", json={"disk_mb": 1024}), 422)
    failed = (await c.get("/v1/sandboxes", params={"state": "failed"})).json()["sandboxes"]
    # An unknown template is refused before a row exists; a create that failed in the
    # runtime leaves a failed row.
    assert sorted(s["template"] for s in failed) == ["base"]


async def test_exec_env_merge_and_decoding(api: Api) -> None:
    sbx = await create(api, env={"A": "1", "B": "2"})
    r = await api.client.post(
        f"/v1/sandboxes/{sbx['id']}/exec", json={"cmd": ["echo", "hi"], "env": {"B": "3"}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == "echo hi\ufffd"
    fake = api.app.state.service.runtime.sandbox(sbx["id"])
    assert fake.last_env == {"A": "1", "B": "3"}


BAD_REQUESTS: list[tuple[str, str, object]] = [
    ("POST", "/v1/sandboxes", b"{not json"),
    ("POST", "/v1/sandboxes", b"[1, 2]"),
    ("POST", "/v1/sandboxes", {"ttl_seconds": "soon"}),
    ("POST", "/v1/sandboxes", {"ttl_seconds": 10**30}),
    ("POST", "/v1/sandboxes", {"ttl_seconds": -1}),
    ("POST", "/v1/sandboxes", {"vcpus": 1000}),
    ("POST", "/v1/sandboxes", {"memory_mb": 1.5}),
    ("POST", "/v1/sandboxes", {"unknown": 1}),
    ("POST", "/v1/sandboxes", {"template": "x" * 10_000}),
    ("POST", "/v1/sandboxes", {"metadata": {str(i): "v" for i in range(1000)}}),
    ("POST", "/v1/sandboxes", {"env": {"A": 1}}),
    ("POST", "/v1/sandboxes", b"\xff\xfe\x00"),
    ("GET", "/v1/sandboxes/sbx-000000000000", None),
    ("GET", "/v1/sandboxes/" + "x" * 5000, None),
    ("GET", "/v1/sandboxes/%00", None),
    ("GET", "/v1/sandboxes/..%2F..%2Fetc", None),
    ("DELETE", "/v1/sandboxes/nope", None),
    ("GET", "/v1/nope", None),
    ("PUT", "/v1/sandboxes", None),
    ("DELETE", "/v1/sandboxes", None),
    ("POST", "/v1/sandboxes/{id}/exec", {}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": ""}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": []}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": "true", "timeout_seconds": 0}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": "true", "timeout_seconds": 1e300}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": "a\x00b"}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": ["a", 1]}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": "true", "env": {"A=B": "x"}}),
    ("POST", "/v1/sandboxes/{id}/exec", {"cmd": "true", "cwd": "/\x00"}),
    ("POST", "/v1/sandboxes/{id}/exec/stream", {"cmd": 5}),
    ("GET", "/v1/sandboxes/{id}/files?path=/a%00b", None),
    ("GET", "/v1/sandboxes/{id}/files", None),
    ("GET", "/v1/sandboxes/{id}/files?path=", None),
    ("GET", "/v1/sandboxes/{id}/files?path=/missing", None),
    ("PUT", "/v1/sandboxes/{id}/files?path=/x&mode=999", b"x"),
    ("PUT", "/v1/sandboxes/{id}/files?path=/x&mode=rwx", b"x"),
    ("GET", "/v1/sandboxes/{id}/files/stat?path=/missing", None),
    ("POST", "/v1/sandboxes/{id}/files/mkdir", {"path": ""}),
    ("POST", "/v1/sandboxes/{id}/files/rename", {"src": "/a"}),
    ("POST", "/v1/sandboxes/{id}/files/rename", {"src": "/a\x00", "dst": "/b"}),
    ("DELETE", "/v1/sandboxes/{id}/files?path=/missing&recursive=maybe", None),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "/missing", "pattern": "x"}),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "/d", "pattern": "x" * 1025}),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "/d", "pattern": "\u00e9" * 513}),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "/d", "pattern": ""}),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "/d", "pattern": "a\nb"}),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "d", "pattern": "x"}),
    ("POST", "/v1/sandboxes/{id}/files/grep", {"path": "/d", "pattern": "x", "regex": True}),
    ("POST", "/v1/sandboxes/{id}/files/glob", {"path": "/d", "pattern": "../etc/*"}),
    ("POST", "/v1/sandboxes/{id}/files/glob", {"path": "/d", "pattern": "/etc/*"}),
    ("POST", "/v1/sandboxes/{id}/files/glob", {"path": "/d\u0000", "pattern": "*"}),
    ("POST", "/v1/sandboxes/{id}/processes", {"cmd": None}),
    ("POST", "/v1/sandboxes/{id}/processes/abc/signal", {"signal": 9}),
    ("POST", "/v1/sandboxes/{id}/processes/99999999999999999999/signal", {"signal": 9}),
    ("POST", "/v1/sandboxes/{id}/processes/7/signal", {"signal": 9}),
    ("POST", "/v1/sandboxes/{id}/processes/42/signal", {"signal": 0}),
    ("POST", "/v1/sandboxes/{id}/processes/42/wait?timeout_seconds=-1", None),
    ("POST", "/v1/sandboxes/{id}/processes/42/wait?timeout_seconds=nan", None),
    ("PATCH", "/v1/sandboxes/{id}/lifecycle", {"ttl_seconds": 0}),
    ("PATCH", "/v1/sandboxes/{id}/lifecycle", {"persistent": "yes please"}),
    ("POST", "/v1/templates", {"name": "t", "spec": {"exposed_ports": ["80/http"]}}),
    ("POST", "/v1/templates", {"name": "t", "spec": {"exposed_ports": ["8000-8010"]}}),
    ("POST", "/v1/templates", {"name": "t", "spec": {"exposed_ports": [80]}}),
    ("POST", "/v1/keys", {"name": ""}),
    ("POST", "/v1/keys", {"name": "n", "admin": True}),
    ("PUT", "/v1/registry-credentials/ghcr.io", {"username": "a:b", "password": "p"}),
    ("PUT", "/v1/registry-credentials/ghcr.io", {"username": "a"}),
    ("PUT", "/v1/registry-credentials/ghcr.io", {"username": "a", "password": "p\n"}),
    ("PUT", "/v1/registry-credentials/not_a_host", {"username": "a", "password": "p"}),
    ("PUT", "/v1/registry-credentials/ghcr.io", b'{"username": "a", "password": "\\ud800"}'),
    ("DELETE", "/v1/registry-credentials/not_a_host", None),
    # escaped lone surrogates decode to a str that is not Unicode: refused up front (400)
    ("POST", "/v1/sandboxes", b'{"metadata": {"\\ud800": "x"}}'),
    ("POST", "/v1/sandboxes", b'{"env": {"A": "\\udfff"}}'),
    ("POST", "/v1/keys", b'{"name": "\\ud800"}'),
    ("POST", "/v1/sandboxes/{id}/exec", b'{"cmd": ["echo", "\\ud800"]}'),
    ("POST", "/v1/sandboxes/{id}/exec", b'{"cmd": "true", "stdin": "\\udc80"}'),
    ("POST", "/v1/sandboxes/{id}/processes", b'{"cmd": "\\ud800"}'),
    ("POST", "/v1/sandboxes/{id}/files/mkdir", b'{"path": "/\\ud800"}'),
    ("POST", "/v1/sandboxes/{id}/exec", b'{"cmd": "true", "timeout_seconds": NaN}'),
    ("POST", "/v1/sandboxes", b'{"ttl_seconds": 1' + b"0" * 5000 + b"}"),
    ("POST", "/v1/sandboxes", b"[" * 100_000 + b"]" * 100_000),
]


async def test_bad_input_is_always_a_4xx_envelope(api: Api) -> None:
    sbx = await create(api)
    for method, url, body in BAD_REQUESTS:
        url = url.replace("{id}", str(sbx["id"]))
        kwargs: dict[str, object] = {}
        if isinstance(body, bytes):
            kwargs["content"] = body
            kwargs["headers"] = {"content-type": "application/json"}
        elif body is not None:
            kwargs["json"] = body
        r = await api.client.request(method, url, **kwargs)  # type: ignore[arg-type]
        assert 400 <= r.status_code < 500, (method, url, body, r.status_code, r.text)
        assert_envelope(r, r.status_code)
    # the sandbox still works after all that
    r = await api.client.post(f"/v1/sandboxes/{sbx['id']}/exec", json={"cmd": "true"})
    assert r.status_code == 200


async def test_guest_strings_that_are_not_unicode_are_shown_with_replacement(api: Api) -> None:
    sid = (await create(api))["id"]
    fake = api.app.state.service.runtime.sandbox(sid)
    fake.files["/d/bad\udcff.txt"] = b"x"  # how a non-UTF-8 name arrives from the guest
    r = await api.client.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/d"})
    assert r.status_code == 200, r.text
    assert r.json()["entries"][0]["name"] == "bad\ufffd.txt"

    async def procs() -> list[dict[str, object]]:
        return [{"pid": 7, "cmd": "cat \udcff", "running": True}]

    r = await api.client.post(f"/v1/sandboxes/{sid}/files/glob",
                              json={"path": "/d", "pattern": "*.txt"})
    assert r.status_code == 200 and r.json() == {"paths": ["/d/bad\ufffd.txt"],
                                                 "truncated": False}
    fake.files["/d/bad\udcff.txt"] = b"a\nX \xff\n"
    r = await api.client.post(f"/v1/sandboxes/{sid}/files/grep",
                              json={"path": "/d", "pattern": "x", "ignore_case": True})
    assert r.status_code == 200 and r.json() == {"matches": [
        {"path": "/d/bad\ufffd.txt", "line": 2, "text": "X \ufffd"}], "truncated": False}

    fake.procs = procs
    r = await api.client.get(f"/v1/sandboxes/{sid}/processes")
    assert r.status_code == 200 and r.json()["processes"][0]["cmd"] == "cat \ufffd"


async def test_status_codes_of_the_matrix(api: Api) -> None:
    c = api.client
    sbx = await create(api)
    sid = sbx["id"]
    assert_envelope(
        await c.post("/v1/sandboxes", content=b"{", headers={"content-type": "application/json"}),
        400,
        "bad_request",
    )
    assert_envelope(await c.post("/v1/sandboxes", json={"unknown": 1}), 422, "validation_error")
    assert_envelope(await c.get("/v1/nope"), 404, "not_found")
    assert_envelope(await c.put("/v1/sandboxes"), 405, "bad_request")
    assert_envelope(await c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/missing"}), 404)
    await c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/f"}, content=b"x")
    assert_envelope(
        await c.post(f"/v1/sandboxes/{sid}/files/mkdir", json={"path": "/f"}), 409, "conflict"
    )
    assert_envelope(
        await c.post(f"/v1/sandboxes/{sid}/processes/7/signal", json={"signal": 9}), 404
    )


async def test_upload_limit(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_upload_bytes=1000)
    async with running_app(settings, FakeRuntime(tmp_path)) as api:
        sid = (await create(api))["id"]
        url = f"/v1/sandboxes/{sid}/files"
        r = await api.client.put(url, params={"path": "/ok"}, content=b"x" * 1000)
        assert r.status_code == 200 and r.json() == {"path": "/ok", "size": 1000}
        assert_envelope(
            await api.client.put(url, params={"path": "/big"}, content=b"x" * 1001),
            413,
            "payload_too_large",
        )

        async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted while streaming
            for _ in range(5):
                yield b"y" * 300

        r = await api.client.put(url, params={"path": "/big"}, content=chunks())
        assert_envelope(r, 413, "payload_too_large")


async def test_rate_limit(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, rate_limit_per_second=0.01, rate_limit_burst=3)
    async with running_app(settings, FakeRuntime(tmp_path)) as api:
        codes = [(await api.client.get("/v1/sandboxes")).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = await api.client.get("/v1/sandboxes")
        assert_envelope(r, 429, "rate_limited")
        assert int(r.headers["retry-after"]) >= 1


async def test_lifecycle_patch_ttl_and_idle_reaper(tmp_path: Path) -> None:
    # The idle timeout (3 s) outlasts the patched TTL (2 s), so the TTL sandbox can only end
    # as expired, however late this loop runs (with 1 s, a stalled loop let it be reaped).
    settings = make_settings(tmp_path, idle_timeout_seconds=3, reaper_interval_seconds=0.1)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        c = api.client
        idle = await create(api, ttl_seconds=3600)
        keep = await create(api, ttl_seconds=1, persistent=True)
        ttl = await create(api, ttl_seconds=3600)
        lc = (await c.patch(f"/v1/sandboxes/{ttl['id']}/lifecycle", json={"ttl_seconds": 2})).json()
        assert lc["expires_at"] == pytest.approx(lc["created_at"] + 2)
        assert lc["idle_timeout_seconds"] == 3 and lc["state"] == "running"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = {
                s["id"]: s["state"] for s in (await c.get("/v1/sandboxes")).json()["sandboxes"]
            }
            if states[ttl["id"]] != "running" and states[idle["id"]] != "running":
                break
            await asyncio.sleep(0.1)
        assert states == {idle["id"]: "reaped", keep["id"]: "running", ttl["id"]: "expired"}
        assert set(runtime.killed) == {idle["id"], ttl["id"]}
        assert (await c.get(f"/v1/sandboxes/{keep['id']}/lifecycle")).json()["persistent"]


async def test_retention_purges_ended_rows(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, retention_seconds=0, reaper_interval_seconds=0.1)
    async with running_app(settings, FakeRuntime(tmp_path)) as api:
        sid = (await create(api))["id"]
        await api.client.delete(f"/v1/sandboxes/{sid}")
        deadline = time.monotonic() + 30  # the next sweeps purge it: wait for that, not 0.4 s
        while (r := await api.client.get(f"/v1/sandboxes/{sid}")).status_code != 404:
            assert r.json()["state"] == "killed", r.text
            assert time.monotonic() < deadline, r.text
            await asyncio.sleep(0.1)
        assert_envelope(r, 404)


async def test_reconcile_on_start(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        gone = str((await create(api))["id"])
        kept = (await create(api))["id"]
        ended = str((await create(api))["id"])
        api.app.state.service.store.end_sandbox(ended, "killed", "its kill never reached "
                                                "the host")
    stray = "sbx-0000000000aa"
    await runtime.create(sandbox_id=stray)
    # A fork the host made whose children's rows were never written (the server died
    # between the two): the child of a sandbox this database has is its own leftover.
    [orphan] = await runtime.fork(str(kept))
    del runtime.sandboxes[gone]
    async with running_app(settings, runtime) as api:
        assert (await api.client.get(f"/v1/sandboxes/{gone}")).json()["state"] == "failed"
        assert (await api.client.get(f"/v1/sandboxes/{kept}")).json()["state"] == "running"
        # An ended row's VM goes; a VM this database never had a row for is left running
        # and reported (a database restored from an older backup: ADR 0047, addendum).
        assert ended in runtime.killed and ended not in runtime.sandboxes
        assert stray not in runtime.killed and stray in runtime.sandboxes
        assert api.app.state.service.unknown_vms == [stray]
        assert orphan.id in runtime.killed and orphan.id not in runtime.sandboxes
    async with running_app(make_settings(tmp_path, kill_unknown_vms=True), runtime) as api:
        assert stray in runtime.killed and stray not in runtime.sandboxes
        assert api.app.state.service.unknown_vms == []


async def test_unhandled_exception_is_a_500_envelope(api: Api) -> None:
    sid = (await create(api))["id"]

    async def boom(*args: object, **kwargs: object) -> list[dict[str, object]]:
        raise RuntimeError("bug")

    api.app.state.service.runtime.sandbox(sid).procs = boom
    r = await api.client.get(f"/v1/sandboxes/{sid}/processes")
    assert_envelope(r, 500, "internal")


def test_openapi_matches_committed_spec() -> None:
    from pandastack.server.app import create_app
    from pandastack.server.settings import Settings

    committed = json.loads(SPEC.read_text())
    assert committed == create_app(Settings()).openapi(), "run scripts/gen-openapi.py"


async def test_a_kill_while_a_long_operation_runs_leaves_its_end_clean(api: Api) -> None:
    """A file stream (or any operation marked busy) that ends after its sandbox was killed
    used to fail its own cleanup with a KeyError (the kill had dropped the busy count),
    which hid why it ended and logged a traceback."""
    sid = str((await create(api))["id"])
    service = api.app.state.service
    async with service.busy(sid):
        assert service.is_busy(sid)
        r = await api.client.delete(f"/v1/sandboxes/{sid}")
        assert r.status_code == 204, r.text
    assert not service.is_busy(sid)
    async with service.busy(sid), service.busy(sid):  # nested marks still count
        assert service.is_busy(sid)
    assert not service.is_busy(sid)
