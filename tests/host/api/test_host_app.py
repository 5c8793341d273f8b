"""The host app's HTTP surface: its token, its error envelope, its committed OpenAPI document
with curated operationIds, and the streams' framing on the wire."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import httpx
import pytest

from pandastack.host.api import create_host_app
from pandastack.host.api.spec import render
from pandastack.hostport.frames import Decoder, Kind
from pandastack.hostport.protocols import RuntimePort
from tests.host.api.fake_host import Emit, FakeHost

SPEC = Path(__file__).resolve().parents[3] / "spec" / "host-openapi.json"
TOKEN = "s3cret-token"


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, FakeHost]]:
    host = FakeHost()
    host.add("sbx-1")
    app = create_host_app(cast(RuntimePort, host), TOKEN)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c, host


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}",
                                    f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"])
async def test_wrong_or_missing_token_is_401(
        client: tuple[httpx.AsyncClient, FakeHost], header: str | None) -> None:
    c, _ = client
    headers = {} if header is None else {"Authorization": header}
    c.headers.pop("Authorization")
    for method, url in (("GET", "/v1/sandboxes"), ("GET", "/v1/host"),
                        ("DELETE", "/v1/sandboxes/sbx-1"),
                        ("POST", "/v1/sandboxes/sbx-1/exec")):
        r = await c.request(method, url, headers=headers, json={"cmd": "true"})
        assert r.status_code == 401, (method, url, r.text)
        assert r.json()["error"]["type"] == "Unauthorized"
    r = await c.get("/health", headers=headers)  # liveness, nothing else, needs no token
    assert r.status_code == 200 and r.json() == {"status": "ok"}


async def test_the_token_opens_it(client: tuple[httpx.AsyncClient, FakeHost]) -> None:
    c, _ = client
    r = await c.get("/v1/sandboxes")
    assert r.status_code == 200
    assert r.json() == {"sandboxes": [{"id": "sbx-1", "state": "running", "alive": True,
                                       "forked_from": None}]}


async def test_errors_are_envelopes_with_their_status(
        client: tuple[httpx.AsyncClient, FakeHost]) -> None:
    c, host = client
    r = await c.get("/v1/sandboxes/sbx-nope")
    assert r.status_code == 404
    assert r.json() == {"error": {"type": "SandboxNotFound", "message": "no sandbox sbx-nope",
                                  "attributes": {}}}
    r = await c.post("/v1/sandboxes/sbx-1/exec", json={"cmd": 1})
    assert r.status_code == 422 and r.json()["error"]["type"] == "ValueError"
    host.fail["kill"] = RuntimeError("a bug")
    r = await c.delete("/v1/sandboxes/sbx-1")
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "HostError"
    assert "RuntimeError: a bug" in r.json()["error"]["message"]


async def test_exec_answer_is_frames_ending_in_the_result(
        client: tuple[httpx.AsyncClient, FakeHost]) -> None:
    c, host = client

    async def script(out: Emit, err: Emit) -> int:
        await out(b"hello ")
        await err(b"oops")
        await out(b"world")
        return 3

    host.sandboxes["sbx-1"].script["greet"] = script
    r = await c.post("/v1/sandboxes/sbx-1/exec", json={"cmd": "greet"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-pandastack-frames"
    decoder = Decoder()
    frames = decoder.feed(r.content)
    assert decoder.finished
    assert [(f.kind, f.payload) for f in frames[:-1]] == [
        (Kind.STDOUT, b"hello "), (Kind.STDERR, b"oops"), (Kind.STDOUT, b"world")]
    assert frames[-1].kind is Kind.RESULT
    assert json.loads(frames[-1].payload) == {"exit_code": 3, "duration_ms": 1.0,
                                              "timed_out": False, "signal": None,
                                              "truncated": False}


def test_committed_document_is_current() -> None:
    assert SPEC.read_text() == render(), "run: python -m pandastack.host.api.spec"


def test_operation_ids_are_curated_camel_case_and_unique() -> None:
    document = json.loads(render())
    ids = [(op["operationId"], f"{m.upper()} {p}")
           for p, ops in document["paths"].items() for m, op in ops.items()]
    assert len(ids) > 35
    names = [i for i, _ in ids]
    assert len(set(names)) == len(names)
    for operation_id, where in ids:
        assert re.fullmatch(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)*", operation_id), where
        assert not re.search(r"_v1_|_(?:get|post|put|delete)$", operation_id), where
    by_route = {where: i for i, where in ids}
    assert by_route["POST /v1/sandboxes/{sandbox_id}/exec"] == "execCommand"
    assert by_route["PUT /v1/sandboxes/{sandbox_id}/files/content"] == "writeFile"
    assert by_route["POST /v1/templates/builds"] == "buildTemplate"
    exec_200 = document["paths"]["/v1/sandboxes/{sandbox_id}/exec"]["post"]["responses"]["200"]
    assert exec_200["content"] == {"application/x-pandastack-frames": {
        "schema": {"$ref": "#/components/schemas/ExecDone"}}}
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
