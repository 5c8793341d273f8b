"""The sandbox-port listener's E2B routing and credentials over the in-memory runtime:
which sandbox port a request names (headers or host name), which token opens it, and the
error shapes E2B's SDKs read. The fake runtime's slot is a loopback HTTP server this module
starts, standing in for a sandbox's own port."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import struct
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect
from websockets.sync.server import ServerConnection, serve

from pandastack.hostport.errors import GuestOSError
from pandastack.hostport.results import ExecResult
from pandastack.server.compat.e2b.envd import process
from pandastack.server.compat.e2b.envd.connect import ConnectError
from pandastack.server.compat.e2b.tokens import tokens_for
from pandastack.server.sandboxes.lifecycle import HIBERNATE, WAKE
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.live import fake_server
from tests.server.preview_client import preview_client

ENVD = 49983
LIST = "/process.Process/List"
PLAIN = "/no-such-route"  # past the credentials, a plain path of the daemon's (404 there)
JSON = {"Content-Type": "application/json"}


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        reply = json.dumps({"path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    runtime = FakeRuntime(tmp_path / "sandboxes")
    runtime.ns_ip = "127.0.0.1"
    async with running_app(make_settings(tmp_path), runtime) as a:
        yield a


async def new_sandbox(api: Api, key: str | None = None) -> str:
    r = await api.client.post("/v1/sandboxes", json={}, headers=api.headers(key))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def envd_token(api: Api, sid: str) -> str:
    return tokens_for(api.app.state.store).envd_access(sid)


def traffic_token(api: Api, sid: str) -> str:
    return tokens_for(api.app.state.store).traffic_access(sid)


def routed(sid: str, port: int | str = ENVD, **extra: str) -> dict[str, str]:
    """E2B's routing headers (and `extra` ones, `_` for `-`)."""
    return {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(port),
            **{k.replace("_", "-"): v for k, v in extra.items()}}


def assert_e2b(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == status, body
    return str(body["message"])


def assert_connect(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code and isinstance(body["message"], str), body


async def test_header_routing_and_envd_token(api: Api) -> None:
    sid = await new_sandbox(api)
    token = envd_token(api, sid)
    async with preview_client(api, "localhost") as c:
        ok = await c.post(LIST, json={}, headers={**routed(sid, X_Access_Token=token), **JSON})
        assert ok.status_code == 200, ok.text
        # no sandbox named at all, or half of the pair: 400, E2B-shaped
        assert_e2b(await c.post(LIST, json={}, headers={"X-Access-Token": token, **JSON}), 400)
        assert_e2b(await c.post(LIST, json={}, headers={"E2b-Sandbox-Id": sid,
                                                        "X-Access-Token": token}), 400)
        for port in ("70000", "x", ""):
            assert_e2b(await c.post(LIST, json={}, headers=routed(sid, port,
                                                                  X_Access_Token=token)), 400)
        # a wrong token, no token, the traffic token where the envd token is due: 401,
        # Connect-shaped on a Connect path, E2B-shaped on a plain one
        for headers in (routed(sid, X_Access_Token="0" * 64), routed(sid),
                        routed(sid, X_Access_Token=traffic_token(api, sid))):
            assert_connect(await c.post(LIST, json={}, headers={**headers, **JSON}), 401,
                           "unauthenticated")
            assert_e2b(await c.get(PLAIN, headers=headers), 401)
        # a token for a sandbox that does not exist is still just a wrong token
        assert_e2b(await c.get(PLAIN, headers=routed("sbx-000000000000",
                                                     X_Access_Token=token)), 401)


async def test_api_keys_open_only_their_teams_sandboxes(api: Api) -> None:
    sid = await new_sandbox(api)
    other = await api.new_key("other-team")
    mine = await api.new_key("default")
    async with preview_client(api, "localhost") as c:
        r = await c.get(PLAIN, headers={**routed(sid), "X-API-Key": other})
        assert "not found" in assert_e2b(r, 404)
        r = await c.post(LIST, json={}, headers={**routed(sid), "X-API-Key": other, **JSON})
        assert_connect(r, 404, "not_found")
        r = await c.post(LIST, json={}, headers={**routed(sid), "X-API-Key": mine, **JSON})
        assert r.status_code == 200, r.text
        # a made-up id with a key: 404, as our API says
        r = await c.get(PLAIN, headers={**routed("sbx-000000000000"), "X-API-Key": mine})
        assert_e2b(r, 404)
        # a bad key is 401 (E2B-shaped on E2B's routes)
        assert_e2b(await c.get(PLAIN, headers={**routed(sid), "X-API-Key": "psk_nope"}), 401)


async def test_an_ended_sandbox_reads_as_gone(api: Api) -> None:
    """A killed sandbox is what E2B's proxy says of one: 502 "... was not found" (the SDKs'
    health probe then reports it not running), to its token or its team's key only."""
    sid = await new_sandbox(api)
    token = envd_token(api, sid)
    assert (await api.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204
    other = await api.new_key("other-team")
    async with preview_client(api, "localhost") as c:
        r = await c.post(LIST, json={}, headers={**routed(sid, X_Access_Token=token), **JSON})
        assert_connect(r, 502, "unavailable")
        assert "was not found" in r.json()["message"]
        assert "was not found" in assert_e2b(await c.get(PLAIN, headers=routed(
            sid, X_Access_Token=token)), 502)
        assert "was not found" in assert_e2b(await c.get("/", headers=routed(
            sid, 8000, E2B_Traffic_Access_Token=traffic_token(api, sid))), 502)
        assert_e2b(await c.get(PLAIN, headers={**routed(sid), "X-API-Key": other}), 404)
        r = await c.get(PLAIN, headers={**routed(sid), "X-API-Key": api.admin_key})
        assert_e2b(r, 502)


async def test_host_name_routing(api: Api) -> None:
    sid = await new_sandbox(api)
    token = envd_token(api, sid)
    async with preview_client(api, f"{ENVD}-{sid}.localhost") as c:
        r = await c.post(LIST, json={}, headers={"X-Access-Token": token, **JSON})
        assert r.status_code == 200, r.text
        assert_e2b(await c.get(PLAIN, headers={"X-Access-Token": "bad"}), 401)
        # headers that name another port than the host: refused, not followed
        r = await c.post(LIST, json={}, headers={**routed(sid, 8000), "X-Access-Token": token})
        assert_e2b(r, 400)
        # a Connect path that is no method: Connect's own 404
        r = await c.post("/process.Process/Nope", json={},
                         headers={"X-Access-Token": token, **JSON})
        assert_connect(r, 404, "unimplemented")
        assert_e2b(await c.post("/nothere/atall", headers={"X-Access-Token": token}), 404)
        assert_e2b(await c.get(PLAIN, headers={"X-Access-Token": token}), 404)


async def test_paused_and_hibernated_sandboxes(api: Api) -> None:
    """As E2B's proxy answers for a paused sandbox: 502 "was not found" (the SDK's
    is_running() is then False; Connect's unavailable), paused or hibernated alike, unless
    its lifecycle resumes on traffic (autoResume): such a hibernated sandbox is woken by the
    call."""
    sid = await new_sandbox(api)
    headers = {**routed(sid, X_Access_Token=envd_token(api, sid)), **JSON}
    assert (await api.client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
    async with preview_client(api, "localhost") as c:
        r = await c.post(LIST, json={}, headers=headers)
        assert_connect(r, 502, "unavailable")
        assert "was not found" in r.json()["message"] and "paused" in r.json()["message"]
        assert "was not found" in assert_e2b(await c.get(PLAIN, headers=headers), 502)
        assert (await api.client.post(f"/v1/sandboxes/{sid}/resume")).status_code == 200
        r = await api.client.post(f"/v1/sandboxes/{sid}/hibernate")
        assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
        assert_connect(await c.post(LIST, json={}, headers=headers), 502, "unavailable")
        assert (await api.client.get(f"/v1/sandboxes/{sid}")).json()["state"] == "hibernated"
        api.app.state.store.update_sandbox(sid, on_expiry=HIBERNATE)  # autoPause alone
        assert_connect(await c.post(LIST, json={}, headers=headers), 502, "unavailable")
        api.app.state.store.update_sandbox(sid, on_expiry=HIBERNATE + WAKE)  # autoResume
        r = await c.post(LIST, json={}, headers=headers)
        assert r.status_code == 200, r.text
    assert (await api.client.get(f"/v1/sandboxes/{sid}")).json()["state"] == "running"


async def test_other_ports_take_the_traffic_token(api: Api, upstream: int) -> None:
    sid = await new_sandbox(api)
    async with preview_client(api, "localhost") as c:
        for token in (traffic_token(api, sid), envd_token(api, sid)):
            r = await c.get("/echo?a=1", headers={**routed(sid, upstream),
                                                  "E2B-Traffic-Access-Token": token})
            assert r.status_code == 200, r.text
            seen = r.json()
            assert seen["path"] == "/echo?a=1"
            # E2B's credentials and routing are ours: the sandbox's server sees none of them
            assert not {"e2b-traffic-access-token", "x-access-token", "e2b-sandbox-id",
                        "e2b-sandbox-port"} & set(seen["headers"])
        r = await c.get("/", headers={**routed(sid, upstream),
                                      "E2B-Traffic-Access-Token": "f" * 64})
        assert_e2b(r, 401)
        assert_e2b(await c.get("/", headers=routed(sid, upstream)), 401)
    # our own callers of the same listener keep our envelope
    async with preview_client(api, f"{upstream}-{sid}.localhost") as c:
        assert_envelope(await c.get("/"), 401, "unauthorized")
        r = await c.get("/", headers={"E2B-Traffic-Access-Token": traffic_token(api, sid)})
        assert r.status_code == 200, r.text


async def test_basic_auth_user_is_checked(api: Api) -> None:
    sid = await new_sandbox(api)
    headers = {**routed(sid, X_Access_Token=envd_token(api, sid)), **JSON}
    async with preview_client(api, "localhost") as c:
        for bad in ("Basic !!!", "Basic " + base64.b64encode(b"a b:").decode()):
            assert_connect(await c.post(LIST, json={}, headers={**headers,
                                                                "Authorization": bad}),
                           400, "invalid_argument")
        good = "Basic " + base64.b64encode(b"root:").decode()
        r = await c.post(LIST, json={}, headers={**headers, "Authorization": good})
        assert r.status_code == 200, r.text


# -- process.Process through the listener, over the in-memory host --------------------------

def stream_events(body: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages of a Connect stream and its end-of-stream message (decoded JSON)."""
    messages: list[dict[str, Any]] = []
    while body:
        flags, length = struct.unpack(">BI", body[:5])
        data, body = json.loads(body[5:5 + length]), body[5 + length:]
        if flags & 0x02:
            return messages, data
        messages.append(data)
    raise AssertionError("no end of stream")


def envelope(message: Mapping[str, object]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


async def test_process_service_on_the_fake_host(api: Api) -> None:
    sid = await new_sandbox(api)
    base = routed(sid, X_Access_Token=envd_token(api, sid))
    stream = {**base, "Content-Type": "application/connect+json"}
    unary = {**base, **JSON}
    async with preview_client(api, "localhost") as c:
        r = await c.post("/process.Process/Start", headers=stream, content=envelope(
            {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                         "envs": {"A": "1"}}, "tag": "job", "stdin": False}))
        assert r.status_code == 200, r.text
        events, end = stream_events(r.content)
        assert end == {}
        assert events[0] == {"event": {"start": {"pid": 42}}}
        assert {"event": {"data": {"stdout": base64.b64encode(b"out\n").decode()}}} in events
        assert {"event": {"data": {"stderr": base64.b64encode(b"err\n").decode()}}} in events
        assert events[-1] == {"event": {"end": {"exitCode": 0, "exited": True,
                                                "status": "exit status 0"}}}
        # the fake's process 42 still runs: listed with what it was started with, its tag
        listed = (await c.post("/process.Process/List", json={}, headers=unary)).json()
        assert listed == {"processes": [{"pid": 42, "tag": "job", "config": {
            "cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}}}]}
        body: Mapping[str, object]
        for method, body in (
                ("SendSignal", {"process": {"tag": "job"}, "signal": "SIGNAL_SIGKILL"}),
                ("SendInput", {"process": {"pid": 42}, "input": {"stdin": "aGk="}}),
                ("CloseStdin", {"process": {"pid": 42}})):
            r = await c.post(f"/process.Process/{method}", json=body, headers=unary)
            assert r.status_code == 200 and r.json() == {}, (method, r.text)
        # selectors of nothing, bad input: Connect errors, never a 500
        for method, body, status, code in (
                ("SendSignal", {"process": {"pid": 7}, "signal": "SIGNAL_SIGTERM"}, 404,
                 "not_found"),
                ("SendSignal", {"process": {"pid": 42}, "signal": "SIGNAL_SIGHUP"}, 400,
                 "invalid_argument"),
                ("SendInput", {"process": {"tag": "nope"}, "input": {"stdin": ""}}, 404,
                 "not_found"),
                ("SendInput", {"process": {"pid": 42}, "input": {"stdin": "!!"}}, 400,
                 "invalid_argument"),
                ("SendInput", {"process": {"pid": 42}, "input": {"pty": "aGk="}}, 400,
                 "failed_precondition"),
                ("CloseStdin", {"process": {}}, 400, "invalid_argument"),
                ("CloseStdin", {"process": {"pid": -1}}, 400, "invalid_argument"),
                ("Update", {"process": {"pid": 42}, "pty": {"size": {"cols": 0, "rows": 5}}},
                 400, "invalid_argument")):
            assert_connect(await c.post(f"/process.Process/{method}", json=body,
                                        headers=unary), status, code)
        # a Start that cannot start ends its stream with the reason
        for bad in ({"process": {"cmd": ""}}, {"process": {"cmd": "x", "args": [1]}},
                    {"process": {"cmd": "x", "envs": {"A": 1}}},
                    {"process": {"cmd": "a\u0000b"}}, {"process": "x"}):
            r = await c.post("/process.Process/Start", headers=stream, content=envelope(bad))
            events, end = stream_events(r.content)
            assert events == [] and end["error"]["code"] == "invalid_argument", (bad, end)
        # the in-memory host has no terminals: its refusal ends the stream as a Connect error
        r = await c.post("/process.Process/Start", headers=stream, content=envelope(
            {"process": {"cmd": "bash"}, "pty": {"size": {"cols": 80, "rows": 24}}}))
        events, end = stream_events(r.content)
        assert events == [] and end["error"]["code"] in ("unimplemented", "invalid_argument")



async def test_quiet_stream_keepalives_and_leaving_it() -> None:
    """A quiet process's stream gets a keepalive per Keepalive-Ping-Interval (the follower
    only goes on once the test has seen one: no timing assertion); leaving the stream stops
    the following."""
    go, left = asyncio.Event(), asyncio.Event()

    async def follow(put: Callable[[dict[str, object]], Awaitable[None]]) -> None:
        try:
            await go.wait()
            await put({"event": {"data": {"stdout": "aGk="}}})
            await asyncio.Event().wait()  # then quiet for good
        finally:
            left.set()

    request = Request({"type": "http", "method": "POST", "path": "/", "query_string": b"",
                       "headers": [(b"keepalive-ping-interval", b"1")]})
    events = process._events(request, 7, follow)
    assert isinstance(events, AsyncGenerator)  # for its aclose() below
    assert await anext(events) == {"event": {"start": {"pid": 7}}}
    assert await anext(events) == {"event": {"keepalive": {}}}
    go.set()
    item = await anext(events)
    while item == {"event": {"keepalive": {}}}:
        item = await anext(events)
    assert item == {"event": {"data": {"stdout": "aGk="}}}
    await events.aclose()  # the client went away
    assert left.is_set()


async def test_the_calls_deadline_ends_the_stream(api: Api) -> None:
    """Connect-Timeout-Ms is the process's deadline (E2B's command `timeout`): its end is
    deadline_exceeded, the SDKs' timeout error, not an `end` a failed command would send;
    a quiet stream ends at the deadline too."""
    sid = await new_sandbox(api)
    fake = api.app.state.service.runtime.handle(sid)

    async def killed_at_its_deadline(pid: int, **_: object) -> ExecResult:
        return ExecResult(137, b"", b"", 2000.0, True, 9, False)

    fake.attach = killed_at_its_deadline
    headers = {**routed(sid, X_Access_Token=envd_token(api, sid)),
               "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "2000"}
    async with preview_client(api, "localhost") as c:
        r = await c.post("/process.Process/Start", headers=headers,
                         content=envelope({"process": {"cmd": "sleep"}}))
        events, end = stream_events(r.content)
        assert events == [{"event": {"start": {"pid": 42}}}]
        assert end["error"]["code"] == "deadline_exceeded", end

    request = Request({"type": "http", "method": "POST", "path": "/", "query_string": b"",
                       "headers": [(b"connect-timeout-ms", b"50")]})

    async def quiet(put: Callable[[dict[str, object]], Awaitable[None]]) -> None:
        await asyncio.Event().wait()

    events_of = process._events(request, 7, quiet)
    assert await anext(events_of) == {"event": {"start": {"pid": 7}}}
    with pytest.raises(ConnectError) as expired:
        await anext(events_of)
    assert expired.value.code == "deadline_exceeded"


def test_websockets_to_other_ports_take_the_traffic_token(tmp_path: Path) -> None:
    """A WebSocket to a sandbox's own port by E2B's routing headers and traffic token, on a
    real uvicorn (the in-memory host's slot is a loopback echo server); a wrong token is
    refused before the handshake, E2B-shaped."""
    def echo_handler(conn: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            for message in conn:
                conn.send(message)

    server = serve(echo_handler, "127.0.0.1", 0, compression=None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    echo_port = int(server.socket.getsockname()[1])
    try:
        with fake_server(tmp_path, fake_ns_ip="127.0.0.1") as srv:
            r = httpx.post(f"{srv.url}/sandboxes", json={"templateID": "base"},
                           headers={"X-API-Key": srv.admin_key}, timeout=30)
            assert r.status_code == 201, r.text
            sid, token = r.json()["sandboxID"], r.json()["trafficAccessToken"]
            url = f"ws://127.0.0.1:{srv.preview_port}/room"
            headers = routed(sid, echo_port, E2B_Traffic_Access_Token=token)
            with ws_connect(url, additional_headers=headers, proxy=None, open_timeout=10) as ws:
                ws.send("hello")
                assert ws.recv(10) == "hello"
            with pytest.raises(InvalidStatus) as refused:
                ws_connect(url, additional_headers={**headers,
                                                    "E2B-Traffic-Access-Token": "f" * 64},
                           proxy=None, open_timeout=10)
            assert refused.value.response.status_code == 401
            assert json.loads(refused.value.response.body or b"{}")["code"] == 401
    finally:
        server.shutdown()


async def test_start_user_and_working_directory(api: Api) -> None:
    """What a Start asks the host for: the Basic-auth user (else E2B's `user`); the request's
    directory, else the template's WORKDIR, else the user's home (/home/<name>; where the guest
    has none, a wrapper that changes to $HOME and execs the command, keeping its pid; also for
    a relative directory); the sandbox's env under the request's."""
    sid = await new_sandbox(api)
    fake = api.app.state.service.runtime.handle(sid)
    spawned: list[dict[str, Any]] = []

    async def spawn(cmd: object, **kwargs: object) -> int:
        spawned.append({"cmd": cmd, **kwargs})
        if kwargs["cwd"] == "/home/homeless":
            raise GuestOSError("ENOENT", "No such file or directory", "/home/homeless")
        return 42

    fake.spawn = spawn
    headers = {**routed(sid, X_Access_Token=envd_token(api, sid)),
               "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "60000"}
    root = "Basic " + base64.b64encode(b"root:").decode()
    async with preview_client(api, "localhost") as c:
        for extra, process_config in (
                ({}, {"cmd": "ls", "args": ["-a"]}),
                ({"Authorization": root}, {"cmd": "ls", "cwd": "/srv", "envs": {"A": "1"}})):
            r = await c.post("/process.Process/Start", headers={**headers, **extra},
                             content=envelope({"process": process_config}))
            assert stream_events(r.content)[1] == {}
        api.app.state.store.update_sandbox(sid, cwd="/app", env={"B": "2"})
        r = await c.post("/process.Process/Start", headers=headers,
                         content=envelope({"process": {"cmd": "ls"}}))
        assert stream_events(r.content)[1] == {}
        # a relative directory is the home's, the template's WORKDIR notwithstanding
        r = await c.post("/process.Process/Start", headers=headers,
                         content=envelope({"process": {"cmd": "ls", "cwd": "rel/dir"}}))
        assert stream_events(r.content)[1] == {}
        api.app.state.store.update_sandbox(sid, cwd=None)
        homeless = "Basic " + base64.b64encode(b"homeless:").decode()
        r = await c.post("/process.Process/Start", headers={**headers, "Authorization": homeless},
                         content=envelope({"process": {"cmd": "ls"}}))
        events, end = stream_events(r.content)
        assert end == {} and events[0] == {"event": {"start": {"pid": 42}}}
    home, explicit, workdir, relative, refused, wrapped = spawned
    assert home["user"] == "user" and home["cwd"] == "/home/user"
    assert home["cmd"] == ["ls", "-a"] and home["timeout"] == 60.0
    assert relative["cwd"] is None and relative["cmd"][:2] == ["/bin/sh", "-c"]
    assert 'cd "$HOME"' in relative["cmd"][2] and relative["cmd"][3:] == ["sh", "rel/dir", "ls"]
    assert refused["cwd"] == "/home/homeless" and refused["cmd"] == ["ls"]
    assert wrapped["user"] == "homeless" and wrapped["cwd"] is None
    assert wrapped["cmd"][3:] == ["sh", "", "ls"]
    assert explicit["user"] == "root" and explicit["cwd"] == "/srv"
    assert explicit["cmd"] == ["ls"] and explicit["env"] == {"A": "1"}
    assert workdir["cwd"] == "/app" and workdir["cmd"] == ["ls"]
    assert workdir["env"] == {"B": "2"}


async def test_a_team_past_its_commands_starts_nothing(api: Api) -> None:
    """A Start holds one of the team's commands running for as long as its stream is
    followed; past the bound it is resource_exhausted before anything starts."""
    sid = await new_sandbox(api)
    service = api.app.state.service
    fake = service.runtime.handle(sid)
    spawned: list[object] = []
    real_spawn = fake.spawn

    async def spawn(cmd: object, **kwargs: object) -> int:
        spawned.append(cmd)
        return int(await real_spawn(cmd, **kwargs))

    fake.spawn = spawn
    team = service.store.sandbox_by_id(sid).team
    held = [service.exec_slots.acquire(team) for _ in range(service.exec_slots.limit)]
    headers = {**routed(sid, X_Access_Token=envd_token(api, sid)),
               "Content-Type": "application/connect+json"}
    async with preview_client(api, "localhost") as c:
        r = await c.post("/process.Process/Start", headers=headers,
                         content=envelope({"process": {"cmd": "ls"}}))
        events, end = stream_events(r.content)
        assert events == [] and end["error"]["code"] == "resource_exhausted", end
        assert spawned == []
        held.pop()()
        r = await c.post("/process.Process/Start", headers=headers,
                         content=envelope({"process": {"cmd": "ls"}}))
        assert stream_events(r.content)[1] == {} and len(spawned) == 1
    assert service.exec_slots.held(team) == len(held)  # the finished stream gave it back


def test_what_is_remembered_of_started_processes_is_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "MAX_PROCESSES_REMEMBERED", 2)
    monkeypatch.setattr(process, "MAX_SANDBOXES_REMEMBERED", 2)
    known = process.Registry()

    def started(tag: str) -> process.Started:
        return process.Started({"cmd": "x"}, tag, False)

    for pid in (1, 2, 3):
        known.add("a", pid, started(str(pid)))
    assert list(known.of("a")) == [2, 3]  # the oldest went
    known.add("b", 1, started("b"))
    known.of("a")  # used again: now the most recent
    known.add("c", 1, started("c"))
    assert set(known.by_sandbox) == {"a", "c"}


async def test_a_start_is_one_host_call(api: Api) -> None:
    """Start asks the host once (spawn_attach: the pid, then the output), with `stdin: false`
    as the process's own (no stdin at all), never a spawn, a stdin close and an attach."""
    sid = await new_sandbox(api)
    fake = api.app.state.service.runtime.handle(sid)
    calls: list[tuple[str, object]] = []
    real_spawn_attach = fake.spawn_attach

    async def spawn_attach(cmd: object, **kwargs: Any) -> object:
        calls.append(("spawn_attach", kwargs["stdin"]))
        return await real_spawn_attach(cmd, **kwargs)

    async def send_stdin(pid: int, data: bytes, *, eof: bool = False) -> None:
        calls.append(("send_stdin", eof))

    fake.spawn_attach, fake.send_stdin = spawn_attach, send_stdin
    headers = {**routed(sid, X_Access_Token=envd_token(api, sid)),
               "Content-Type": "application/connect+json"}
    async with preview_client(api, "localhost") as c:
        for stdin in (False, True):
            r = await c.post("/process.Process/Start", headers=headers, content=envelope(
                {"process": {"cmd": "ls"}, "stdin": stdin}))
            events, end = stream_events(r.content)
            assert end == {} and events[0] == {"event": {"start": {"pid": 42}}}
    assert calls == [("spawn_attach", False), ("spawn_attach", True)]
