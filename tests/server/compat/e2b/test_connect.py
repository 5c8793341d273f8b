"""The Connect JSON codec (compat/e2b/envd/connect.py) on its own: envelopes both ways, the
end of a stream with and without an error, and what bad input gets (a Connect error, never a
500): malformed JSON, oversize and compressed messages, the wrong codec, unknown methods."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pandastack.server.compat.e2b.envd import connect
from pandastack.server.compat.e2b.envd.app import build, translate
from pandastack.server.compat.e2b.envd.connect import (
    ClientStream,
    ConnectError,
    Message,
    ServerStream,
    Unary,
    envelope,
    field,
)
from pandastack.server.web.errors import ApiError

STREAM = {"Content-Type": "application/connect+json"}


def parse(body: bytes) -> tuple[list[Message], Message]:
    """The messages of a streamed answer and its end-of-stream message (which must be last)."""
    messages: list[Message] = []
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        data, body = json.loads(body[5:5 + length]), body[5 + length:]
        if flags & connect.END_STREAM:
            assert not body, "data after the end of the stream"
            return messages, data
        assert flags == 0
        messages.append(data)
    raise AssertionError("the stream has no end-of-stream message")


async def echo(request: Request, message: Message) -> Message:
    if message.get("fail") == "api":
        raise ApiError(404, "not_found", "no such thing")
    if message.get("fail") == "connect":
        raise ConnectError("failed_precondition", "not now")
    if message.get("fail") == "bug":
        raise RuntimeError("a bug")
    return {"got": message, "exitCode": field(message, "exitCode")}


async def count(request: Request, message: Message) -> AsyncIterator[Message]:
    for i in range(int(message.get("n", 0))):
        yield {"i": i}
    if message.get("fail") == "api":
        raise ApiError(409, "conflict", "it changed")
    if message.get("fail") == "bug":
        raise RuntimeError("a bug")


async def total(request: Request, messages: AsyncIterator[Message]) -> Message:
    return {"sum": sum([int(m.get("v", 0)) async for m in messages])}


METHODS: dict[str, Unary | ServerStream | ClientStream] = {
    "Echo": Unary(echo), "Count": ServerStream(count), "Total": ClientStream(total)}


async def route(request: Request) -> Response:
    try:
        return await connect.serve(request, METHODS[request.path_params["m"]], translate)
    except RuntimeError:
        return Response("bug", status_code=500)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=[Route("/t.T/{m}", route, methods=["POST"])])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        yield c


def assert_error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code, body
    return str(body["message"])


async def test_unary(client: httpx.AsyncClient) -> None:
    r = await client.post("/t.T/Echo", json={"exit_code": 3})
    assert r.status_code == 200 and r.json() == {"got": {"exit_code": 3}, "exitCode": 3}
    assert (await client.post("/t.T/Echo", content=b"",
                              headers={"Content-Type": "application/json"})).json()["got"] == {}
    assert_error(await client.post("/t.T/Echo", json={"fail": "api"}), 404, "not_found")
    assert_error(await client.post("/t.T/Echo", json={"fail": "connect"}), 400,
                 "failed_precondition")
    # a bug of ours is not translated: the caller logs it and answers internal
    assert (await client.post("/t.T/Echo", json={"fail": "bug"})).status_code == 500


@pytest.mark.parametrize("body", [b"{", b"[1]", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000,
                                  b'"text"'])
async def test_unary_bad_json(client: httpx.AsyncClient, body: bytes) -> None:
    r = await client.post("/t.T/Echo", content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 400, "invalid_argument")


async def test_unary_limits(client: httpx.AsyncClient) -> None:
    big = b'{"x": "' + b"a" * connect.MAX_MESSAGE_BYTES + b'"}'
    r = await client.post("/t.T/Echo", content=big, headers={"Content-Type": "application/json"})
    assert_error(r, 429, "resource_exhausted")
    r = await client.post("/t.T/Echo", content=b"{}", headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert_error(r, 501, "unimplemented")
    for media in ("application/proto", "text/plain", None):
        headers = {"Content-Type": media} if media else {}
        r = await client.post("/t.T/Echo", content=b"{}", headers=headers)
        assert "application/json" in assert_error(r, 415, "invalid_argument")


async def test_server_stream(client: httpx.AsyncClient) -> None:
    r = await client.post("/t.T/Count", content=envelope({"n": 3}), headers=STREAM)
    assert r.status_code == 200 and r.headers["content-type"] == "application/connect+json"
    assert parse(r.content) == ([{"i": 0}, {"i": 1}, {"i": 2}], {})
    # an error after the stream began ends it, in the end-of-stream message, under a 200
    r = await client.post("/t.T/Count", content=envelope({"n": 1, "fail": "api"}),
                          headers=STREAM)
    assert r.status_code == 200
    messages, end = parse(r.content)
    assert messages == [{"i": 0}]
    assert end["error"]["code"] == "already_exists" and end["error"]["message"] == "it changed"
    # a bug too: still a well-formed end of stream
    messages, end = parse((await client.post(
        "/t.T/Count", content=envelope({"n": 2, "fail": "bug"}), headers=STREAM)).content)
    assert messages == [{"i": 0}, {"i": 1}] and end["error"]["code"] == "internal"


async def test_server_stream_bad_requests(client: httpx.AsyncClient) -> None:
    cases = [
        (b"", 400, "invalid_argument"),  # no request message
        (envelope({"n": 1})[:-2], 400, "invalid_argument"),  # cut inside the envelope
        (struct.pack(">BI", 0, 3) + b"{x}", 400, "invalid_argument"),  # not JSON
        (struct.pack(">BI", 0, connect.MAX_MESSAGE_BYTES + 1), 429, "resource_exhausted"),
        (struct.pack(">BI", connect.COMPRESSED, 2) + b"{}", 501, "unimplemented"),
    ]
    for body, status, code in cases:
        assert_error(await client.post("/t.T/Count", content=body, headers=STREAM), status, code)
    assert_error(await client.post("/t.T/Count", content=envelope({}), headers={
        **STREAM, "Connect-Content-Encoding": "gzip"}), 501, "unimplemented")
    assert_error(await client.post("/t.T/Count", json={}), 415, "invalid_argument")


async def test_client_stream(client: httpx.AsyncClient) -> None:
    body = b"".join(envelope({"v": v}) for v in (1, 2, 3))
    r = await client.post("/t.T/Total", content=body, headers=STREAM)
    assert r.status_code == 200
    assert parse(r.content) == ([{"sum": 6}], {})
    r = await client.post("/t.T/Total", content=body + b"\x00\x00", headers=STREAM)
    messages, end = parse(r.content)
    assert messages == [] and end["error"]["code"] == "invalid_argument"


async def test_unknown_service_or_method() -> None:
    """The daemon's app: no such service or method is Connect's 404 `unimplemented`; a GET
    of a method is 405; neither is a 5xx."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(build()),
                                 base_url="http://t") as c:
        for path in ("/process.Process/Nope", "/nope.Nope/List", "/filesystem.Filesystem/X"):
            assert_error(await c.post(path, json={}), 404, "unimplemented")
        assert_error(await c.get("/process.Process/List"), 405, "unimplemented")
