"""E2B's official Python SDK (`e2b` 2.63.0) running commands and terminals against a live
server and real VMs, through E2B's `process.Process` (compat/e2b/envd/process.py): foreground
and background commands, streamed output, stdin, kill, list, reconnect, a PTY, the OS user,
and the seed's agent loop. One sandbox serves the module."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import (
    CommandExitException,
    PtySize,
    Sandbox,
    SandboxNotRunningException,
    TimeoutException,
)

from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

BUGGY = "def mean(xs):\n    return sum(xs) / len(xs)\n\nprint(mean([]))\n"
FIXED = "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n\nprint(mean([]))\n"


def _opts(live: LiveServer) -> dict[str, object]:
    return live.e2b(http_version="1.1", request_timeout=120)


@pytest.fixture(scope="module")
def sbx(live_server: LiveServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("base", timeout=900, **_opts(live_server))  # type: ignore[arg-type]
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _running(sbx: Sandbox) -> set[int]:
    return {p.pid for p in sbx.commands.list()}


def _until(check: object, what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.1)


def test_foreground_output_and_exit_codes(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo out; echo err >&2; printf 'é'")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\né", "err\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("python3 -c 'import json; json.loads(\"{\")'")
    assert failed.value.exit_code == 1
    assert "Traceback (most recent call last)" in failed.value.stderr
    assert "json.decoder.JSONDecodeError" in failed.value.stderr
    # the environment and working directory a call names
    r = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp")
    assert r.stdout == "hi\n/tmp\n"


def test_users_and_their_homes(sbx: Sandbox) -> None:
    # E2B's SDK names no user by default: E2B's default account runs it, from its home
    assert sbx.commands.run("whoami; echo $HOME; pwd").stdout == "user\n/home/user\n/home/user\n"
    r = sbx.commands.run("whoami; echo $HOME; pwd", user="root")
    assert r.stdout == "root\n/root\n/root\n"
    # `user` has passwordless sudo, as in E2B's images
    assert sbx.commands.run("sudo -n whoami").stdout == "root\n"
    # a relative directory is the user's home's (E2B's daemon reads it so)
    sbx.commands.run("mkdir -p rel/dir")
    assert sbx.commands.run("pwd", cwd="rel/dir").stdout == "/home/user/rel/dir\n"
    with pytest.raises(CommandExitException):  # root's home has no rel/
        sbx.commands.run("pwd", cwd="rel", user="root")


def test_background_output_streams_and_takes_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("echo ready; read line; echo got $line; echo bye >&2",
                              background=True, stdin=True)
    seen: list[str] = []
    errors: list[str] = []
    answered: list[bool] = []

    def on_stdout(text: str) -> None:
        seen.append(text)
        if "ready\n" in "".join(seen) and not answered:
            # answered from the output callback: the first line came before the exit
            answered.append(True)
            sbx.commands.send_stdin(handle.pid, "hello\n")

    result = handle.wait(on_stdout=on_stdout, on_stderr=errors.append)
    assert "".join(seen) == "ready\ngot hello\n" and "".join(errors) == "bye\n"
    assert result.exit_code == 0 and result.stdout == "ready\ngot hello\n"


def test_stdin_closed(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat; echo '[eof]'", background=True, stdin=True)
    handle.send_stdin("abc\n")
    handle.send_stdin(b"def\n")
    handle.close_stdin()
    assert handle.wait().stdout == "abc\ndef\n[eof]\n"
    # without stdin=True (the SDK's default) a reader sees end of input at once
    assert sbx.commands.run("cat; echo done", timeout=30).stdout == "done\n"


def test_list_kill_and_connect(sbx: Sandbox) -> None:
    sleeper = sbx.commands.run("sleep 600", background=True)
    listed = {p.pid: p for p in sbx.commands.list()}
    assert sleeper.pid in listed
    assert (listed[sleeper.pid].cmd, listed[sleeper.pid].args) == (
        "/bin/bash", ["-l", "-c", "sleep 600"])
    assert sbx.commands.kill(sleeper.pid) is True
    with pytest.raises(CommandExitException):
        sleeper.wait()
    _until(lambda: sleeper.pid not in _running(sbx), "the killed process to leave the list")
    assert sbx.commands.kill(sleeper.pid) is False

    # Counts until told to stop (a file), so it is still running when listed, however slow
    # the host, and ends as soon as the test has reconnected.
    counter = sbx.commands.run("i=0; while [ ! -e /tmp/stop-counting ]; do i=$((i+1)); "
                               "echo $i; sleep 0.2; done; echo stopped", background=True)
    counter.disconnect()  # the process runs on without a follower
    assert counter.pid in _running(sbx)
    again = sbx.commands.connect(counter.pid)
    sbx.commands.run("touch /tmp/stop-counting")
    result = again.wait()
    assert result.exit_code == 0 and result.stdout.split()[-1] == "stopped", result


def test_pty(sbx: Sandbox) -> None:
    chunks: list[bytes] = []
    ended: list[BaseException] = []
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))

    def wait() -> None:
        try:
            terminal.wait(on_pty=chunks.append)
        except CommandExitException as exc:
            ended.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()

    def output() -> str:
        return b"".join(chunks).decode(errors="replace")

    sbx.pty.send_stdin(terminal.pid, b"stty size; tty\n")
    _until(lambda: "24 80" in output(), "the first size")
    sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))

    def resized() -> bool:
        # Resize and input are separate calls that may reach the terminal in either order:
        # ask again until the new size shows.
        sbx.pty.send_stdin(terminal.pid, b"stty size\n")
        time.sleep(0.5)
        return "30 100" in output()

    _until(resized, "the new size", 30)
    sbx.pty.send_stdin(terminal.pid, b"exit 3\n")
    waiter.join(60)
    assert not waiter.is_alive()
    assert "30 100" in output() and "/dev/pts/" in output()
    assert len(ended) == 1 and isinstance(ended[0], CommandExitException)
    assert ended[0].exit_code == 3
    # a terminal's timeout ends it, followed or not
    # (10 s: creating it, leaving it and listing took over 3 s on busy cores)
    short = sbx.pty.create(PtySize(rows=24, cols=80), timeout=10)
    short.disconnect()
    assert short.pid in _running(sbx)
    _until(lambda: short.pid not in _running(sbx), "the terminal's timeout to end it")


def test_timeout_ends_the_command(sbx: Sandbox) -> None:
    """A command's `timeout` bounds the process, not only the call: E2B's daemon kills it
    then, and so does ours (the call's Connect-Timeout-Ms is the process's deadline)."""
    before = _running(sbx)
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 600", timeout=3)
    _until(lambda: not [p for p in sbx.commands.list()
                        if p.pid not in before and p.args[-1:] == ["sleep 600"]],
           "the timed-out command to be killed")


def test_raw_host_name_routing(sbx: Sandbox, live_server: LiveServer) -> None:
    """E2B_DOMAIN mode: `{port}-{sandbox id}.{domain}` names the sandbox, no routing headers."""
    url = f"http://127.0.0.1:{live_server.preview_port}/process.Process/List"
    host = f"49983-{sbx.sandbox_id}.localhost:{live_server.preview_port}"
    token = sbx._envd_access_token
    assert token
    r = httpx.post(url, json={}, headers={"Host": host, "X-Access-Token": token}, timeout=60)
    assert r.status_code == 200, r.text
    assert isinstance(r.json().get("processes", []), list)
    r = httpx.post(url, json={}, headers={"Host": host, "X-Access-Token": "nope"}, timeout=60)
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


def test_agent_loop(sbx: Sandbox, live_server: LiveServer) -> None:
    """The seed's loop: write a program with a bug, run it, read the traceback, fix it, run
    it again, start a server in the background and kill it."""
    sbx.files.write("/home/user/app/stats.py", BUGGY)
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("python3 stats.py", cwd="/home/user/app")
    assert "ZeroDivisionError" in failed.value.stderr
    assert 'File "/home/user/app/stats.py", line 2, in mean' in failed.value.stderr
    sbx.files.write("/home/user/app/stats.py", FIXED)
    assert sbx.commands.run("python3 stats.py", cwd="/home/user/app").stdout == "0.0\n"
    server = sbx.commands.run("python3 -m http.server 8000", background=True,
                              cwd="/home/user/app")
    probe = ("python3 -c \"import urllib.request as u; "
             "print(u.urlopen('http://localhost:8000/stats.py').status)\" 2>/dev/null || true")
    _until(lambda: sbx.commands.run(probe).stdout == "200\n", "the server to answer")
    # the app's port from outside, as E2B's SDKs reach one: routing headers and the
    # sandbox's traffic token, on the sandbox-port listener
    outside = httpx.get(f"http://127.0.0.1:{live_server.preview_port}/stats.py", headers={
        "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000",
        "E2B-Traffic-Access-Token": sbx.traffic_access_token or ""}, timeout=60)
    assert outside.status_code == 200 and outside.text == FIXED
    assert sbx.commands.kill(server.pid)
    _until(lambda: server.pid not in _running(sbx), "the server to stop")


def test_sandbox_killed_under_a_running_command(live_server: LiveServer) -> None:
    """The SDK tells a sandbox killed under a command from a network failure by probing
    /health: an ended sandbox answers as E2B's proxy does (502 "... was not found")."""
    doomed = Sandbox.create("base", timeout=300, **_opts(live_server))  # type: ignore[arg-type]
    try:
        handle = doomed.commands.run("sleep 120", background=True)
    finally:
        doomed.kill()
    with pytest.raises(SandboxNotRunningException) as gone:
        handle.wait()
    assert "killed or reached its end of life" in str(gone.value)
    with pytest.raises(SandboxNotRunningException):
        doomed.commands.run("true")
