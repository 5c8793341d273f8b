"""`pandastack sandbox ...`: argument parsing, output formatting, and each command against a
fake API (no server, no VMs)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from pandastack import (
    APIConnectionError,
    ConfigError,
    ExecResult,
    NotFoundError,
    SandboxInfo,
    TransportTimeoutError,
)
from pandastack.cli import sandbox as cli
from tests.sdk.fakes import (
    API_KEY,
    API_URL,
    SANDBOX,
    FakeAPI,
    body,
    envelope,
    exec_result,
    reply,
    sse,
    stream_reply,
)

NOW = 10_000.0
EXEC = "/v1/sandboxes/sb-1/exec"
STREAM = "/v1/sandboxes/sb-1/exec/stream"
FILES = "/v1/sandboxes/sb-1/files"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pandastack")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.add_parser(sub)
    return parser.parse_args(["sandbox", *argv])


def info(**fields: Any) -> SandboxInfo:
    return SandboxInfo.model_validate({**SANDBOX, **fields})


# -- parsing ------------------------------------------------------------------------------

def test_create_defaults() -> None:
    args = parse("create")
    assert args.sandbox_command == "create"
    assert (args.template, args.ttl, args.persistent, args.vcpus, args.memory_mb) == (
        "base", None, False, None, None)
    assert args.metadata == [] and args.env == [] and not args.json


def test_create_options_and_repeated_metadata() -> None:
    args = parse("create", "--template", "py", "--ttl", "600", "--persistent", "--vcpus", "2",
                 "--memory-mb", "1024", "--metadata", "a=1", "b=", "--metadata", "c=x=y",
                 "--env", "K=V", "--json")
    assert (args.template, args.ttl, args.persistent, args.vcpus, args.memory_mb) == (
        "py", 600, True, 2, 1024)
    assert args.metadata == [("a", "1"), ("b", ""), ("c", "x=y")]
    assert args.env == [("K", "V")] and args.json


@pytest.mark.parametrize("argv", [
    ["create", "--metadata", "novalue"],
    ["create", "--metadata", "=v"],
    ["create", "--ttl", "0"],
    ["create", "--vcpus", "two"],
    ["list", "--state", "bogus"],
    ["exec", "sb-1"],
    ["exec", "--timeout", "0", "sb-1", "--", "true"],
    ["exec", "--timeout", "soon", "sb-1", "--", "true"],
    ["kill"],
    ["frobnicate"],
])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_exec_takes_everything_after_the_double_dash() -> None:
    args = parse("exec", "--timeout", "5", "sb-1", "--", "sh", "-c", "echo hi; exit 3")
    assert args.id == "sb-1" and args.timeout == 5.0
    assert args.cmd == ["sh", "-c", "echo hi; exit 3"]
    assert cli.exec_command(args.cmd) == ["sh", "-c", "echo hi; exit 3"]
    args = parse("exec", "sb-1", "--", "ls", "-la", "--json")  # after --, nothing is ours
    assert args.cmd == ["ls", "-la", "--json"] and not args.json
    args = parse("exec", "--cwd", "/work", "--env", "A=1", "-i", "sb-1", "echo $A | wc -c")
    assert cli.exec_command(args.cmd) == "echo $A | wc -c"  # one word: a shell line
    assert (args.cwd, args.env, args.stdin, args.timeout) == (
        "/work", [("A", "1")], True, cli.DEFAULT_EXEC_TIMEOUT)


def test_list_kill_shell_arguments() -> None:
    args = parse("list", "--state", "running", "--metadata", "team=a", "--json")
    assert (args.state, args.metadata, args.json) == ("running", [("team", "a")], True)
    assert parse("kill", "sb-1", "sb-2").ids == ["sb-1", "sb-2"]
    assert parse("shell", "sb-1", "--timeout", "30").timeout == 30.0


# -- formatting ---------------------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "0s"), (0, "0s"), (59.9, "59s"), (119, "119s"), (120, "2m"), (7199, "119m"),
    (7200, "2h"), (172799, "47h"), (172800, "2d"),
])
def test_duration(seconds: float, text: str) -> None:
    assert cli.duration(seconds) == text


def test_list_rows() -> None:
    rows = cli.list_rows([
        info(id="sb-1", created_at=NOW - 30, expires_at=NOW + 600, metadata={"b": "2", "a": "1"}),
        info(id="sb-2", persistent=True, expires_at=None, created_at=NOW - 7200, disk_mb=2048,
             vcpus=2, memory_mb=1024),
        info(id="sb-3", state="expired", created_at=NOW - 900, ended_at=NOW - 300),
    ], NOW)
    assert rows == [
        ("sb-1", "running", "base", "30s", "in 10m", "1 vCPU, 512M", "a=1 b=2"),
        ("sb-2", "running", "base", "2h", "persistent", "2 vCPU, 1024M, 2048M disk", "-"),
        ("sb-3", "expired", "base", "15m", "ended 5m ago", "1 vCPU, 512M", "-"),
    ]
    assert all(len(row) == len(cli.LIST_COLUMNS) for row in rows)


def test_list_table_keeps_ids_whole_on_a_narrow_terminal() -> None:
    rows = cli.list_rows([info(id="sbx-0123456789ab", metadata={"owner": "someone"})], NOW)
    console = Console(record=True, width=50, force_terminal=True)
    console.print(cli.list_table(rows))
    text = console.export_text()
    assert "sbx-0123456789ab" in text and "running" in text and "ID" in text


def test_format_error_is_one_line_with_the_request_id() -> None:
    err = NotFoundError("sandbox 'x'\nnot found", status=404, code="not_found",
                        request_id="req_1")
    assert cli.format_error(err) == "sandbox 'x' not found (404 not_found, request req_1)"
    local = NotFoundError("gone", status=404, code="not_found")
    assert cli.format_error(local) == "gone (404 not_found)"
    refused = APIConnectionError("GET /v1/sandboxes: ConnectError: refused")
    assert cli.format_error(refused, "http://h:1") == (
        "cannot reach the pandastack server at http://h:1 "
        "(GET /v1/sandboxes: ConnectError: refused)")
    slow = TransportTimeoutError("GET /v1/sandboxes: timed out (ReadTimeout)")
    assert cli.format_error(slow, "http://h:1").startswith(
        "the pandastack server at http://h:1 did not answer in time")
    assert cli.format_error(ConfigError("no  key\n set")) == "no key set"


def test_error_json() -> None:
    err = NotFoundError("gone", status=404, code="not_found", request_id="r")
    assert cli.error_json(err) == {"error": {
        "type": "NotFoundError", "status": 404, "code": "not_found", "message": "gone",
        "request_id": "r"}}
    assert cli.error_json(ConfigError("x"))["error"]["status"] is None


@pytest.mark.parametrize(("fields", "status"), [
    ({"exit_code": 0}, 0), ({"exit_code": 3}, 3), ({"exit_code": 137, "signal": 9}, 137),
    ({"exit_code": 137, "timed_out": True}, 124), ({"exit_code": 300}, 44),
    ({"exit_code": -1}, 125),
])
def test_exit_status(fields: dict[str, Any], status: int) -> None:
    assert cli.exit_status(ExecResult.model_validate(exec_result(**fields))) == status


@pytest.mark.parametrize(("line", "code"), [
    ("exit", 5), ("  exit  ", 5), ("exit 3", 3), ("exit 256", 0), ("logout", 5), ("quit 1", 1),
    ("exit now", None), ("exiting", None), ("echo exit", None), ("", None),
])
def test_shell_exit(line: str, code: int | None) -> None:
    assert cli.shell_exit(line, 5) == code


def run_script(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=10)


def test_shell_script_tracks_the_directory_and_the_status(tmp_path: Path) -> None:
    (tmp_path / "a b").mkdir()
    state = tmp_path / "cwd"
    done = run_script(cli.shell_script("cd 'a b' && pwd; (exit 4)", str(tmp_path), 0,
                                       str(state)), Path("/"))
    assert done.returncode == 4 and done.stdout == f"{tmp_path}/a b\n"
    assert state.read_text().strip() == f"{tmp_path}/a b"
    # $? starts as the previous line's status, as in one long-lived shell
    done = run_script(cli.shell_script("echo $?", str(tmp_path), 7, str(state)), Path("/"))
    assert done.stdout == "7\n" and done.returncode == 0
    # the directory went away: the line runs in / and says so
    done = run_script(cli.shell_script("pwd", str(tmp_path / "gone"), 0, str(state)),
                      Path("/"))
    assert done.stdout == "/\n" and "is gone" in done.stderr
    # the user's line is line 1, as in a plain `sh -c`, and a comment does not eat the rest
    done = run_script(cli.shell_script(f"cd {tmp_path}/missing", "/", 0, str(state)), Path("/"))
    assert done.returncode != 0 and ": 1: " in done.stderr
    done = run_script(cli.shell_script("true # comment", str(tmp_path), 0, str(state)),
                      Path("/"))
    assert done.returncode == 0 and state.read_text().strip() == str(tmp_path)


# -- commands against a fake API ----------------------------------------------------------

@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_API", API_URL)
    monkeypatch.setenv("PANDASTACK_API_KEY", API_KEY)


def run(api: FakeAPI, *argv: str) -> int:
    return cli.run(parse(*argv), transport=api.transport)


@pytest.mark.usefixtures("configured")
def test_create_prints_the_id(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI().with_sandbox()
    assert run(api, "create", "--ttl", "60", "--metadata", "owner=me", "--env", "A=1") == 0
    assert capsys.readouterr().out == "sb-1\n"
    sent = body(api.last("POST", "/v1/sandboxes"))
    assert sent["template"] == "base" and sent["ttl_seconds"] == 60
    assert sent["metadata"] == {"owner": "me"} and sent["env"] == {"A": "1"}
    assert "vcpus" not in sent and "memory_mb" not in sent  # the server's defaults
    assert not api.calls("DELETE", "/v1/sandboxes/sb-1")  # the sandbox is left running


@pytest.mark.usefixtures("configured")
def test_create_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(FakeAPI().with_sandbox(), "create", "--json") == 0
    assert json.loads(capsys.readouterr().out)["id"] == "sb-1"


@pytest.mark.usefixtures("configured")
def test_list_plain_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes", reply(200, {"sandboxes": [SANDBOX]}))
    assert run(api, "list", "--state", "running", "--metadata", "team=a") == 0
    out = capsys.readouterr().out
    assert out.startswith("sb-1\trunning\tbase\t") and out.count("\n") == 1
    params = api.last("GET", "/v1/sandboxes").url.params
    assert params["state"] == "running"
    assert run(api, "list", "--json") == 0
    assert [s["id"] for s in json.loads(capsys.readouterr().out)] == ["sb-1"]


@pytest.mark.usefixtures("configured")
def test_list_pages(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes",
                       reply(200, {"sandboxes": [SANDBOX], "next_token": "tok-2"}))
    assert run(api, "list", "--limit", "1", "--template", "base", "--json") == 0
    page = json.loads(capsys.readouterr().out)
    assert ([s["id"] for s in page["sandboxes"]], page["next_token"]) == (["sb-1"], "tok-2")
    params = api.last("GET", "/v1/sandboxes").url.params
    assert (params["limit"], params["template"]) == ("1", "base")
    assert run(api, "list", "--limit", "1", "--next-token", "tok-2") == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("sb-1\t") and captured.err == "more: --next-token tok-2\n"
    assert api.last("GET", "/v1/sandboxes").url.params["next_token"] == "tok-2"


@pytest.mark.usefixtures("configured")
def test_list_shows_live_sandboxes_unless_all(capsys: pytest.CaptureFixture[str]) -> None:
    ended = {**SANDBOX, "id": "sb-2", "state": "killed"}
    api = FakeAPI().on("GET", "/v1/sandboxes", reply(200, {"sandboxes": [SANDBOX, ended]}))
    assert run(api, "list") == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["sb-1"]
    assert dict(api.last("GET", "/v1/sandboxes").url.params) == {"include_ended": "false"}
    assert run(api, "list", "--all") == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == [
        "sb-1", "sb-2"]
    assert dict(api.last("GET", "/v1/sandboxes").url.params) == {}


@pytest.mark.usefixtures("configured")
def test_exec_streams_and_exits_with_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    events = sse(("stdout", {"data": "out\n"}), ("stderr", {"data": "err\n"}),
                 ("exit", exec_result(exit_code=3, stdout="out\n", stderr="err\n")))
    api = FakeAPI().with_sandbox().on("POST", STREAM, stream_reply([events]))
    assert run(api, "exec", "sb-1", "--", "sh", "-c", "echo out; echo err >&2; exit 3") == 3
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("out\n", "err\n")
    sent = body(api.last("POST", STREAM))
    assert sent["cmd"] == ["sh", "-c", "echo out; echo err >&2; exit 3"]
    assert sent["timeout_seconds"] == cli.DEFAULT_EXEC_TIMEOUT


@pytest.mark.usefixtures("configured")
def test_exec_timeout_and_json(capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    events = sse(("exit", exec_result(exit_code=137, timed_out=True)))
    api = FakeAPI().with_sandbox().on("POST", STREAM, stream_reply([events]))
    assert run(api, "exec", "--timeout", "2", "sb-1", "sleep 9") == cli.EXIT_TIMED_OUT
    assert "timed out after 2s" in capsys.readouterr().err
    api.on("POST", EXEC, reply(200, exec_result(exit_code=1, stdout="x")))
    monkeypatch.setattr("sys.stdin", io.StringIO("input data"))
    assert run(api, "exec", "--json", "-i", "sb-1", "--", "cat") == 1
    assert json.loads(capsys.readouterr().out)["stdout"] == "x"
    assert body(api.last("POST", EXEC))["stdin"] == "input data"


@pytest.mark.usefixtures("configured")
def test_api_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes/nope",
                       reply(404, envelope("not_found", "sandbox 'nope' not found", "req-7")))
    assert run(api, "exec", "nope", "--", "true") == cli.EXIT_EXEC_FAILED
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: sandbox 'nope' not found (404 not_found, request req-7)\n"
    assert run(api, "shell", "nope") == cli.EXIT_API_ERROR
    assert capsys.readouterr().err.count("\n") == 1
    api.on("DELETE", "/v1/sandboxes/nope", reply(401, envelope("unauthorized", "bad key")))
    assert run(api, "kill", "--json", "nope") == cli.EXIT_API_ERROR
    error = json.loads(capsys.readouterr().err)["error"]
    assert (error["type"], error["status"]) == ("AuthenticationError", 401)


@pytest.mark.usefixtures("configured")
def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    assert cli.run(parse("list"), transport=httpx.MockTransport(refuse)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach the pandastack server at {API_URL} (")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unconfigured(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("list"), transport=FakeAPI().transport) == 1
    assert "no pandastack API URL configured" in capsys.readouterr().err


@pytest.mark.usefixtures("configured")
def test_kill(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI().with_sandbox().on("DELETE", "/v1/sandboxes/sb-2", reply(204))
    assert run(api, "kill", "sb-1", "sb-2") == 0
    assert capsys.readouterr().out == "killed sb-1\nkilled sb-2\n"
    assert run(api, "kill", "--json", "sb-1") == 0
    assert json.loads(capsys.readouterr().out) == {"killed": ["sb-1"]}


@pytest.mark.usefixtures("configured")
def test_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    figures = {"cpu_percent": 12.5, "cpu_count": 2, "memory_used_bytes": 100 << 20,
               "memory_total_bytes": 480 << 20, "disk_used_bytes": 300 << 20,
               "disk_total_bytes": 1 << 30, "window_ms": 200, "sampled_at": NOW}
    api = FakeAPI().with_sandbox().on("GET", "/v1/sandboxes/sb-1/metrics",
                                      reply(200, figures))
    assert run(api, "metrics", "sb-1") == 0
    assert capsys.readouterr().out == ("cpu     12.5% of 2 vCPU over 200 ms\n"
                                       "memory  100 / 480 MiB\ndisk    300 / 1024 MiB\n")
    assert run(api, "metrics", "--json", "sb-1") == 0
    assert json.loads(capsys.readouterr().out) == figures


@pytest.mark.usefixtures("configured")
def test_shell_runs_lines_and_tracks_the_directory(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    scripts: list[str] = []
    cwd = ["/work"]

    def run_line(request: httpx.Request) -> httpx.Response:
        cmd = body(request)["cmd"]
        scripts.append(cmd[-1])
        if "cd /tmp" in cmd[-1]:
            cwd[0] = "/tmp"
        out = f"ran {len(scripts)}\n"
        return httpx.Response(200, content=sse(("stdout", {"data": out}),
                                               ("exit", exec_result(exit_code=2, stdout=out))))

    api = (FakeAPI().with_sandbox()
           .on("POST", EXEC, reply(200, exec_result(stdout="/work\n")))
           .on("POST", STREAM, run_line)
           .on("GET", FILES, lambda r: httpx.Response(200, content=f"{cwd[0]}\n".encode())))
    monkeypatch.setattr("sys.stdin", io.StringIO("echo a\n\ncd /tmp\nls\n"))
    assert run(api, "shell", "sb-1") == 2  # EOF: the last line's status
    assert capsys.readouterr().out == "ran 1\nran 2\nran 3\n"
    assert len(scripts) == 3
    assert "cd -- /work " in scripts[0] and "echo a\n" in scripts[0]
    assert "cd -- /tmp " in scripts[2] and "__pandastack_status 2; ls\n" in scripts[2]
    assert not api.calls("DELETE", "/v1/sandboxes/sb-1")  # leaving does not kill it

    monkeypatch.setattr("sys.stdin", io.StringIO("echo a\nexit 9\necho never\n"))
    assert run(api, "shell", "sb-1") == 9
    assert capsys.readouterr().out == "ran 4\n"
