"""exec (plain and streamed), its HTTP timeouts, and background processes (sync)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest

from pandastack import (
    APIConnectionError,
    NotFoundError,
    ProtocolError,
    Sandbox,
    SandboxError,
    WaitTimeoutError,
)
from pandastack.sdk._base import EXEC_TIMEOUT_MARGIN
from tests.sdk.fakes import (
    API_KEY,
    API_URL,
    FakeAPI,
    body,
    envelope,
    exec_result,
    pieces,
    reply,
    sse,
    stream_reply,
)

EXEC = "/v1/sandboxes/sb-1/exec"
STREAM = "/v1/sandboxes/sb-1/exec/stream"
PROCS = "/v1/sandboxes/sb-1/processes"


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI().with_sandbox()


@pytest.fixture
def sbx(api: FakeAPI) -> Iterator[Sandbox]:
    with Sandbox.create(api_url=API_URL, api_key=API_KEY, transport=api.transport) as sandbox:
        yield sandbox


def read_timeout(request: httpx.Request) -> float | None:
    timeout = request.extensions["timeout"]
    assert isinstance(timeout, dict)
    value = timeout["read"]
    assert value is None or isinstance(value, float | int)
    return value


def test_exec_posts_the_request_and_returns_the_result(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", EXEC, reply(200, exec_result(exit_code=2, stdout="out", stderr="err")))
    result = sbx.exec("ls /nope", timeout_seconds=5, env={"K": "V"}, cwd="/work", stdin="in")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "out", "err")
    assert body(api.last("POST", EXEC)) == {
        "cmd": "ls /nope",
        "timeout_seconds": 5,
        "env": {"K": "V"},
        "cwd": "/work",
        "stdin": "in",
    }


def test_exec_accepts_an_argv_list(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", EXEC, reply(200, exec_result()))
    sbx.exec(("python3", "-c", "print(1)"))
    assert body(api.last("POST", EXEC))["cmd"] == ["python3", "-c", "print(1)"]


def test_commands_run_is_exec(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", EXEC, reply(200, exec_result(stdout="same")))
    assert sbx.commands.run("echo same").stdout == "same"
    assert body(api.last("POST", EXEC)) == {"cmd": "echo same", "timeout_seconds": 60}


@pytest.mark.parametrize("seconds", [1, 60, 300, 600, 3600])
def test_exec_read_timeout_outlasts_the_command(api: FakeAPI, sbx: Sandbox, seconds: int) -> None:
    api.on("POST", EXEC, reply(200, exec_result()))
    sbx.exec("pip install pandas pyarrow", timeout_seconds=seconds)
    read = read_timeout(api.last("POST", EXEC))
    assert read is not None and read >= seconds + EXEC_TIMEOUT_MARGIN
    # ordinary requests keep the client's default
    assert read_timeout(api.last("POST", "/v1/sandboxes")) == 60


def test_streamed_exec_read_timeout_outlasts_the_command(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", STREAM, stream_reply([sse(("exit", exec_result()))]))
    sbx.exec("sleep 299", timeout_seconds=300, on_stdout=print)
    read = read_timeout(api.last("POST", STREAM))
    assert read is not None and read > 300


def test_disabled_client_timeout_stays_disabled(api: FakeAPI) -> None:
    api.on("POST", EXEC, reply(200, exec_result()))
    with Sandbox.create(
        api_url=API_URL, api_key=API_KEY, transport=api.transport, timeout=None
    ) as sbx:
        sbx.exec("true", timeout_seconds=5)
    assert read_timeout(api.last("POST", EXEC)) is None


def test_streaming_exec_calls_back_per_chunk_and_accumulates(api: FakeAPI, sbx: Sandbox) -> None:
    events = sse(
        ("stdout", {"data": "Collecting pandas\n"}),
        ("stderr", {"data": "warn: ü\n"}),
        ("stdout", {"data": "Installed ✓\n"}),
        ("exit", exec_result(exit_code=0, duration_ms=1234.0)),
    )
    api.on("POST", STREAM, stream_reply(pieces(events, 7)))  # splits JSON, CRLF and UTF-8
    out: list[str] = []
    err: list[str] = []
    result = sbx.exec(
        "pip install pandas", timeout_seconds=300, on_stdout=out.append, on_stderr=err.append
    )
    assert out == ["Collecting pandas\n", "Installed ✓\n"]
    assert err == ["warn: ü\n"]
    assert result.stdout == "Collecting pandas\nInstalled ✓\n"
    assert result.stderr == "warn: ü\n"
    assert (result.exit_code, result.duration_ms) == (0, 1234.0)
    request = api.last("POST", STREAM)
    assert request.headers["accept"] == "text/event-stream"
    assert body(request) == {"cmd": "pip install pandas", "timeout_seconds": 300}
    assert api.calls("POST", EXEC) == []


def test_one_callback_is_enough_to_stream(api: FakeAPI, sbx: Sandbox) -> None:
    api.on(
        "POST",
        STREAM,
        stream_reply(
            [
                sse(
                    ("stdout", {"data": "o"}),
                    ("stderr", {"data": "e"}),
                    ("exit", exec_result(exit_code=1)),
                )
            ]
        ),
    )
    err: list[str] = []
    result = sbx.commands.run("x", on_stderr=err.append)
    assert err == ["e"] and result.stdout == "o" and result.exit_code == 1


def test_timed_out_command_is_a_result_not_an_error(api: FakeAPI, sbx: Sandbox) -> None:
    api.on(
        "POST",
        STREAM,
        stream_reply(
            [
                sse(
                    ("stdout", {"data": "partial"}),
                    ("exit", exec_result(exit_code=-1, timed_out=True, signal=9)),
                )
            ]
        ),
    )
    result = sbx.exec("sleep 99", timeout_seconds=1, on_stdout=lambda s: None)
    assert result.timed_out and result.signal == 9 and result.stdout == "partial"


def test_error_event_raises_with_request_id(api: FakeAPI, sbx: Sandbox) -> None:
    api.on(
        "POST",
        STREAM,
        stream_reply(
            [
                sse(
                    ("stdout", {"data": "x"}),
                    ("error", envelope("not_found", "sandbox gone", "r-9")),
                )
            ]
        ),
    )
    with pytest.raises(NotFoundError, match="sandbox gone") as info:
        sbx.exec("x", on_stdout=lambda s: None)
    assert info.value.request_id == "r-9" and info.value.status == 404


def test_error_status_before_the_stream(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", STREAM, reply(409, envelope("conflict", "sandbox is paused", "r-1")))
    with pytest.raises(SandboxError) as info:
        sbx.exec("x", on_stdout=lambda s: None)
    assert info.value.request_id == "r-1" and info.value.status == 409


def test_stream_without_exit_is_a_protocol_error(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", STREAM, stream_reply([sse(("stdout", {"data": "x"}))]))
    with pytest.raises(ProtocolError, match="exit"):
        sbx.exec("x", on_stdout=lambda s: None)


def test_stream_broken_mid_way_is_a_transport_error(api: FakeAPI, sbx: Sandbox) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        def chunks() -> Iterator[bytes]:
            yield sse(("stdout", {"data": "x"}))
            raise httpx.ReadError("connection reset")

        return httpx.Response(200, content=chunks())

    api.on("POST", STREAM, broken)
    with pytest.raises(APIConnectionError, match="connection reset"):
        sbx.exec("x", on_stdout=lambda s: None)


def test_callback_exception_propagates(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", STREAM, stream_reply([sse(("stdout", {"data": "x"}), ("exit", exec_result()))]))

    def explode(text: str) -> None:
        raise ValueError(text)

    with pytest.raises(ValueError, match="x"):
        sbx.exec("x", on_stdout=explode)


def test_processes(api: FakeAPI, sbx: Sandbox) -> None:
    info = {"pid": 42, "cmd": "python3 -m http.server", "running": True}
    (
        api.on("POST", PROCS, reply(201, info))
        .on("GET", PROCS, reply(200, {"processes": [info]}))
        .on("POST", f"{PROCS}/42/stdin", reply(204))
        .on("POST", f"{PROCS}/42/signal", reply(204))
        .on(
            "POST",
            f"{PROCS}/42/wait",
            reply(200, exec_result(exit_code=-9, signal=9, stdout="serving")),
        )
    )
    proc = sbx.commands.start("python3 -m http.server", env={"P": "1"}, cwd="/tmp")
    assert proc.pid == 42 and proc.info.running
    assert body(api.last("POST", PROCS)) == {
        "cmd": "python3 -m http.server",
        "env": {"P": "1"},
        "cwd": "/tmp",
    }
    assert [p.pid for p in sbx.commands.list()] == [42]

    proc.send_stdin("héllo")
    stdin = api.last("POST", f"{PROCS}/42/stdin")
    assert stdin.content == "héllo".encode() and stdin.url.query == b""
    proc.send_stdin(b"\x00raw", eof=True)
    stdin = api.last("POST", f"{PROCS}/42/stdin")
    assert stdin.content == b"\x00raw" and stdin.url.params["eof"] == "true"

    proc.send_signal(signal.SIGTERM)
    assert body(api.last("POST", f"{PROCS}/42/signal")) == {"signal": 15}
    proc.kill()
    assert body(api.last("POST", f"{PROCS}/42/signal")) == {"signal": 9}

    assert proc.wait(timeout_seconds=120).stdout == "serving"
    wait = api.last("POST", f"{PROCS}/42/wait")
    assert wait.url.params["timeout_seconds"] == "120"
    read = read_timeout(wait)
    assert read is not None and read > 120
    proc.wait()
    wait = api.last("POST", f"{PROCS}/42/wait")
    assert "timeout_seconds" not in wait.url.params
    assert read_timeout(wait) is None  # an unbounded wait must not be cut by the client


def test_wait_that_times_out_on_the_server(api: FakeAPI, sbx: Sandbox) -> None:
    api.on("POST", PROCS, reply(201, {"pid": 5, "cmd": "sleep 1000", "running": True}))
    api.on("POST", f"{PROCS}/5/wait", reply(408, envelope("timeout", "still running", "r-w")))
    proc = sbx.commands.start("sleep 1000")
    with pytest.raises(TimeoutError) as info:
        proc.wait(timeout_seconds=1)
    assert isinstance(info.value, WaitTimeoutError) and info.value.request_id == "r-w"
