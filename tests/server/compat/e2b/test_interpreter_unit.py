"""E2B's code interpreter routes (compat/e2b/interpreter/) over a scripted sandbox port:
what they send is read back with the official SDK's own parser (`parse_output`,
`format_exception`), so a line it would misread fails here. The real interpreter in a real VM
is tests/e2e/test_e2b_code_interpreter.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter.models import Execution, format_exception, parse_output
from starlette.applications import Starlette
from starlette.types import Message, Receive, Scope, Send

from pandastack.hostport.errors import CodeContextNotFound, UnsupportedLanguage, VMExited
from pandastack.hostport.results import CodeEvent
from pandastack.server.compat.e2b import interpreter
from pandastack.server.compat.e2b.errors import E2bError
from pandastack.server.compat.e2b.interpreter import routes
from pandastack.server.compat.e2b.interpreter.routes import MAX_BODY_BYTES
from pandastack.server.compat.e2b.interpreter.translate import (
    event_lines,
    parse_run,
    result_object,
    run_env,
)
from pandastack.server.compat.e2b.target import SCOPE_KEY, SandboxTarget
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.web.errors import ApiError

Script = Callable[..., AsyncIterator[CodeEvent]]
BOUND = 30.0  # seconds any wait below may take before the test fails


class FakePort:
    """The code interpreter methods of a sandbox port, each run played by `script`."""

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or plain_run
        self.runs: list[dict[str, Any]] = []
        self.sandbox_env: dict[str, str] = {}
        self.state = "running"
        self.contexts: dict[str, dict[str, object]] = {
            "default-python": {"id": "default-python", "language": "python", "cwd": "/work"}}

    def run_code(self, code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        self.runs.append({"code": code, **kw})
        if kw.get("context_id") is not None and kw["context_id"] not in self.contexts:
            raise AssertionError("a run in an unknown context reached the port")
        return self.script(code, **kw)

    async def create_code_context(self, language: str = "python",
                                  cwd: str | None = None) -> dict[str, object]:
        if language not in ("python", "bash", "javascript"):
            raise UnsupportedLanguage(f"unsupported language {language!r}")
        cid = f"c{len(self.contexts)}"
        self.contexts[cid] = {"id": cid, "language": language, "cwd": cwd or "/work"}
        return self.contexts[cid]

    async def list_code_contexts(self) -> list[dict[str, object]]:
        return list(self.contexts.values())

    async def delete_code_context(self, context_id: str) -> None:
        if self.contexts.pop(context_id, None) is None:
            raise CodeContextNotFound(context_id)

    async def restart_code_context(self, context_id: str) -> None:
        if context_id not in self.contexts:
            raise CodeContextNotFound(context_id)


async def plain_run(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
    yield CodeEvent("stdout", text="hello\n")
    yield CodeEvent("stderr", text="careful\n")
    yield CodeEvent("result", data={"text/plain": "2", "image/png": "iVBORw0KGgo="},
                    is_main_result=True)
    yield CodeEvent("end", execution_count=3)


class FakeService:
    def __init__(self, port: FakePort) -> None:
        self.port = port

    async def running(self, team: str, sandbox_id: str) -> tuple[object, FakePort]:
        assert (team, sandbox_id) == ("team-a", "sbx-000000000001")
        return SimpleNamespace(env=self.port.sandbox_env), self.port

    def row(self, team: str, sandbox_id: str, *, touch: bool = True) -> object:
        return SimpleNamespace(state=self.port.state)


def app_for(port: FakePort) -> Callable[[Scope, Receive, Send], Any]:
    """The routes mounted as the listener mounts them: a target in the scope."""
    inner = Starlette(routes=interpreter.ROUTES)
    target = SandboxTarget(service=cast(SandboxService, FakeService(port)), team="team-a",
                           sandbox_id="sbx-000000000001", port=49999, user=None)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await inner({**scope, SCOPE_KEY: target}, receive, send)
    return app


def client(port: FakePort) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app_for(port)),
                             base_url="http://sandbox")


def read_execution(body: str) -> tuple[Execution, list[dict[str, Any]]]:
    """The SDK's reading of an /execute answer, and the raw objects."""
    execution = Execution()
    lines = body.splitlines()  # as httpx's iter_lines splits them
    for text in lines:
        parse_output(execution, text)
    return execution, [json.loads(text) for text in lines]


# -- translation --------------------------------------------------------------------------

def test_result_bundle_is_spread_over_e2b_fields() -> None:
    obj = result_object({"text/plain": "'hi'", "text/html": "<b>hi</b>",
                         "image/png": "iVBOR", "application/json": '{"a": [1, 2]}',
                         "application/vnd.custom+json": "x"}, True)
    assert obj == {"type": "result", "text": "hi", "html": "<b>hi</b>", "png": "iVBOR",
                   "json": {"a": [1, 2]}, "extra": {"application/vnd.custom+json": "x"},
                   "is_main_result": True}
    # one quote alone is not a quoted string; JSON that does not parse is kept as text
    assert result_object({"text/plain": "'"}, False)["text"] == "'"
    assert result_object({"application/json": "{nope"}, False)["extra"] == {
        "application/json": "{nope"}


def test_end_is_the_count_then_the_end() -> None:
    assert [json.loads(b) for b in event_lines(CodeEvent("end", execution_count=4), 1)] == [
        {"type": "number_of_executions", "execution_count": 4}, {"type": "end_of_execution"}]
    assert [json.loads(b) for b in event_lines(CodeEvent("end"), 1)] == [
        {"type": "end_of_execution"}]


def test_output_with_unicode_line_separators_stays_one_line() -> None:
    # httpx splits lines as str.splitlines does: U+2028, U+0085 or \x1c unescaped would
    # cut the object in two and the SDK's json.loads would fail.
    text = "a\u2028b\x85c\x1cd\ud800e\n"
    raw = event_lines(CodeEvent("stdout", text=text), 5)
    assert len(raw) == 1 and raw[0].endswith(b"\n")
    assert len(raw[0].decode().splitlines()) == 1
    execution, _ = read_execution(raw[0].decode())
    assert execution.logs.stdout == ["a\u2028b\x85c\x1cd\ufffde\n"]


def test_parse_run_refusals() -> None:
    bad: list[dict[str, Any]] = [
        {}, {"code": 1}, {"code": "x\x00"}, {"code": "x", "context_id": 5},
        {"code": "x", "context_id": "c1", "language": "python"},
        {"code": "x", "env_vars": {"A": 1}}, {"code": "x", "env_vars": ["A"]},
        {"code": "x", "env_vars": {"A": "x\x00"}}, {"code": "x", "env_vars": {"A=B": "x"}},
        {"code": "x", "language": "p" * 100}]
    for body in bad:
        with pytest.raises((E2bError, ApiError)) as caught:
            parse_run(body)
        status = getattr(caught.value, "status", None)
        assert status == 400, (body, status)
    run = parse_run({"code": "1", "context_id": None, "language": " JS ", "env_vars": None})
    assert (run.language, run.context_id, run.env) == ("javascript", None, None)


def test_a_run_carries_the_sandbox_env_under_its_own() -> None:
    sandbox = {"FROM_CREATE": "1", "FOO": "sandbox", "my-var": "x", "BAD": "\ud800"}
    assert run_env(sandbox, {"FOO": "run"}) == {"FOO": "run", "FROM_CREATE": "1"}
    assert run_env({}, None) is None
    many = {f"V{i}": "v" for i in range(300)}
    merged = run_env(many, {"MINE": "1"})
    assert merged is not None and len(merged) == 256 and merged["MINE"] == "1"


# -- over HTTP ----------------------------------------------------------------------------

async def test_execute_answers_what_the_sdk_reads() -> None:
    port = FakePort()
    port.sandbox_env = {"FROM_CREATE": "yes"}
    async with client(port) as c:
        r = await c.post("/execute", json={"code": "x + 1", "context_id": None,
                                           "language": None, "env_vars": {"FOO": "bar"}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    execution, raw = read_execution(r.text)
    assert execution.logs.stdout == ["hello\n"] and execution.logs.stderr == ["careful\n"]
    assert execution.text == "2" and execution.results[0].png == "iVBORw0KGgo="
    assert execution.execution_count == 3 and execution.error is None
    assert raw[-1] == {"type": "end_of_execution"}
    assert all(isinstance(o["timestamp"], int) for o in raw if o["type"] == "stdout")
    assert port.runs[0]["language"] == "python" and port.runs[0]["env"] == {"FOO": "bar",
                                                                  "FROM_CREATE": "yes"}


async def test_execute_in_an_unknown_context_is_the_sdks_not_found() -> None:
    port = FakePort()
    async with client(port) as c:
        r = await c.post("/execute", json={"code": "1", "context_id": "nope"})
    assert r.status_code == 404 and r.json()["code"] == 404
    assert isinstance(format_exception(r), NotFoundException)
    assert port.runs == []


async def test_a_run_that_cannot_start_gets_its_own_status() -> None:
    async def unsupported(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        raise UnsupportedLanguage("unsupported language 'r'")
        yield CodeEvent("end")  # pragma: no cover (makes this a generator)

    async with client(FakePort(unsupported)) as c:
        r = await c.post("/execute", json={"code": "1", "language": "r"})
    assert r.status_code == 422, r.text
    assert r.json() == {"code": 422, "message": "unsupported language 'r'"}
    assert isinstance(format_exception(r), SandboxException)


async def test_a_run_that_fails_midway_ends_unexpectedly() -> None:
    async def dies(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        yield CodeEvent("stdout", text="partial\n")
        raise VMExited("the VM process exited")

    async with client(FakePort(dies)) as c:
        r = await c.post("/execute", json={"code": "1"})
    assert r.status_code == 200
    execution, raw = read_execution(r.text)
    assert execution.logs.stdout == ["partial\n"]
    assert execution.error is not None and execution.error.name == "UnexpectedEndOfExecution"
    assert "VM" in execution.error.value
    assert raw[-1] == {"type": "unexpected_end_of_execution"}


async def test_a_sandbox_ended_under_the_call_is_the_sdks_timeout() -> None:
    port = FakePort()

    async def killed(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        if code == "killed":
            port.state = "killed"  # the kill marks the row before it stops the VM
        raise VMExited("the VM process exited")
        yield CodeEvent("end")  # pragma: no cover (makes this a generator)

    port.script = killed
    async with client(port) as c:
        r = await c.post("/execute", json={"code": "killed"})
        assert r.status_code == 502, r.text
        assert isinstance(format_exception(r), TimeoutException)
        assert "sandbox was killed while the request was in progress" in r.json()["message"]
        # the same failure while the sandbox still runs is told as it is
        port.state = "running"
        r = await c.post("/execute", json={"code": "died"})
        assert r.status_code == 409 and "VM" in r.json()["message"]


async def test_a_sandbox_ended_midway_says_so_in_the_last_error() -> None:
    port = FakePort()

    async def killed_midway(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        yield CodeEvent("stdout", text="started\n")
        port.state = "expired"
        raise VMExited("the VM process exited")

    port.script = killed_midway
    async with client(port) as c:
        r = await c.post("/execute", json={"code": "1"})
    execution, _ = read_execution(r.text)
    assert execution.error is not None and "was expired" in execution.error.value


@pytest.mark.parametrize("body", [b"{", b"[]", b'"code"', json.dumps({"code": 3}).encode()])
async def test_bad_bodies_are_400(body: bytes) -> None:
    async with client(FakePort()) as c:
        r = await c.post("/execute", content=body)
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}


async def test_a_body_over_the_bound_is_413() -> None:
    async with client(FakePort()) as c:
        r = await c.post("/execute", content=b" " * (MAX_BODY_BYTES + 1))
    assert r.status_code == 413 and r.json()["code"] == 413


async def test_contexts_create_list_restart_delete() -> None:
    port = FakePort()
    async with client(port) as c:
        r = await c.post("/contexts", json={"language": "python", "cwd": "/tmp"})
        assert r.status_code == 200, r.text
        ctx = r.json()
        assert ctx == {"id": ctx["id"], "language": "python", "cwd": "/tmp"}
        r = await c.post("/contexts", json={})  # the SDK sends {} with no options
        assert r.status_code == 200 and r.json()["language"] == "python"
        r = await c.post("/contexts", content=b"")
        assert r.status_code == 200
        r = await c.post("/contexts", json={"language": "cobol"})
        assert r.status_code == 422 and r.json()["code"] == 422

        listed = (await c.get("/contexts")).json()
        assert ctx in listed and all(set(x) == {"id", "language", "cwd"} for x in listed)

        assert (await c.post(f"/contexts/{ctx['id']}/restart")).status_code == 204
        assert (await c.delete(f"/contexts/{ctx['id']}")).status_code == 204
        assert ctx not in (await c.get("/contexts")).json()
        for r in (await c.post(f"/contexts/{ctx['id']}/restart"),
                  await c.delete(f"/contexts/{ctx['id']}")):
            assert r.status_code == 404 and isinstance(format_exception(r), NotFoundException)
            assert r.json()["message"] == f"Context {ctx['id']} not found"
        r = await c.post("/contexts", json={"cwd": 7})
        assert r.status_code == 400


# -- streaming, driven at the ASGI level (httpx's ASGI transport buffers whole bodies) -----

class Call:
    """One request to the app; the body chunks it sends, as they are sent."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.request = json.dumps(body).encode()
        self.started = asyncio.Event()
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.gone = asyncio.Event()

    async def receive(self) -> Message:
        if self.request:
            body, self.request = self.request, b""
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message
            self.started.set()
        elif message["type"] == "http.response.body" and message.get("body"):
            await self.chunks.put(message["body"])

    def run(self, port: FakePort) -> asyncio.Task[None]:
        scope: Scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                        "http_version": "1.1", "method": "POST", "path": "/execute",
                        "raw_path": b"/execute", "query_string": b"", "root_path": "",
                        "headers": [(b"content-type", b"application/json")],
                        "scheme": "http", "server": ("sandbox", 80)}
        return asyncio.create_task(app_for(port)(scope, self.receive, self.send))


async def test_lines_go_out_as_the_run_produces_them_and_leaving_interrupts_it() -> None:
    read_first = asyncio.Event()
    closed = asyncio.Event()

    async def waits_for_reader(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        try:
            yield CodeEvent("stdout", text="first\n")
            # buffered to the end, the reader never sees "first": the bound fails the test
            await asyncio.wait_for(read_first.wait(), BOUND)
            yield CodeEvent("stdout", text="second\n")
            await asyncio.Event().wait()  # runs until interrupted
        finally:
            closed.set()

    call = Call({"code": "loop"})
    task = call.run(FakePort(waits_for_reader))
    first = await asyncio.wait_for(call.chunks.get(), BOUND)
    assert json.loads(first)["text"] == "first\n"
    read_first.set()
    second = await asyncio.wait_for(call.chunks.get(), BOUND)
    assert json.loads(second)["text"] == "second\n"
    call.gone.set()  # the SDK's timeout: the connection closes
    await asyncio.wait_for(closed.wait(), BOUND)
    await asyncio.wait_for(task, BOUND)


async def test_a_quiet_run_is_answered_before_its_first_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "FIRST_EVENT_WAIT", 0.0)
    started = asyncio.Event()

    async def quiet(code: str, **kw: Any) -> AsyncIterator[CodeEvent]:
        await asyncio.wait_for(started.wait(), BOUND)
        yield CodeEvent("end", execution_count=1)

    call = Call({"code": "import time; time.sleep(60)"})
    task = call.run(FakePort(quiet))
    await asyncio.wait_for(call.started.wait(), BOUND)  # headers before any event
    started.set()
    await asyncio.wait_for(task, BOUND)
    body = b""
    while not call.chunks.empty():
        body += call.chunks.get_nowait()
    execution, raw = read_execution(body.decode())
    assert execution.execution_count == 1 and raw[-1] == {"type": "end_of_execution"}
