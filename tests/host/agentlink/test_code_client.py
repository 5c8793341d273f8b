"""The code interpreter without a VM: event parsing, the interpreter's pure helpers, and
AgentClient.run_code through the REAL agent (--fd test mode) relaying to the REAL
kernel_server.py (running the codeserver package), both run on this host. This host's Python
has no ipykernel, so these use bash (and javascript when node is installed); python kernels are
covered by the VM tests (test_run_code.py)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import cast

import pytest

import pandastack
from pandastack.guest.assets.codeserver import protocol, shell
from pandastack.host.agentlink import code as code_client
from pandastack.host.agentlink.client import AgentClient
from pandastack.host.agentlink.code import LineSplitter, parse_event
from pandastack.hostport.errors import (
    CodeContextNotFound,
    CodeInterpreterError,
    CodeInterpreterUnavailable,
    GuestOSError,
    UnsupportedLanguage,
)
from pandastack.hostport.results import CodeEvent

pytestmark = pytest.mark.timeout(60)

SRC = Path(pandastack.__file__).resolve().parents[1]
SERVER = SRC / "pandastack" / "guest" / "assets" / "kernel_server.py"




# -- pure ----------------------------------------------------------------------------------


def test_parse_events() -> None:
    assert parse_event({"type": "stdout", "text": "hi\n"}) == CodeEvent("stdout", text="hi\n")
    assert parse_event({"type": "result", "data": {"text/plain": "42"},
                        "is_main_result": True}) == \
        CodeEvent("result", data={"text/plain": "42"}, is_main_result=True)
    assert parse_event({"type": "error", "name": "E", "value": "v", "traceback": "t"}) == \
        CodeEvent("error", name="E", value="v", traceback="t")
    assert parse_event({"type": "end", "execution_count": 3}).execution_count == 3
    assert parse_event({"type": "end", "execution_count": None}).execution_count is None
    for bad in ({"type": "nope"}, {"type": "stdout", "text": 1},
                {"type": "result", "data": {"image/png": b"x"}},
                {"type": "end", "execution_count": True}):
        with pytest.raises(ValueError):
            parse_event(bad)


def test_line_splitter_joins_split_lines_and_bounds_them() -> None:
    s = LineSplitter(limit=10)
    assert s.feed(b"ab") == []
    assert s.feed(b"c\nde\nf") == [b"abc", b"de"]
    assert s.pending == 1
    with pytest.raises(CodeInterpreterError):
        s.feed(b"x" * 20)


def test_marker_prefix() -> None:
    assert shell._marker_prefix(b"output __pan", b"__pandastack_done__") == 5
    assert shell._marker_prefix(b"started\n", b"__pandastack_done__") == 0
    assert shell._marker_prefix(b"x_", b"__pandastack_done__") == 1


class Sink:
    """The writer of an interpreter connection, keeping the lines written."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    async def drain(self) -> None:
        pass


async def test_interpreter_drops_results_past_its_bounds() -> None:
    """The guest-side caps (a nicety: the host's own bounds are what protect it) keep an
    honest run's results under the host's limits, with one note instead of an error."""
    server = protocol
    assert server.MAX_RUN_RESULTS < code_client.MAX_RUN_RESULTS
    assert server.MAX_RUN_RESULT_BYTES < code_client.MAX_RUN_RESULT_CHARS
    assert server.MAX_RUN_OUTPUT < code_client.MAX_RUN_TEXT
    sink = Sink()
    out = server.Output(cast(asyncio.StreamWriter, sink))
    for _ in range(server.MAX_RUN_RESULTS + 10):
        await out.result({"text/plain": "1"}, False)
    events = [json.loads(line) for line in sink.lines]
    assert sum(e["type"] == "result" for e in events) == server.MAX_RUN_RESULTS
    notes = [e["text"] for e in events if e["type"] == "stderr"]
    assert len(notes) == 1 and "dropped" in notes[0]
    sink = Sink()
    out = server.Output(cast(asyncio.StreamWriter, sink))
    for _ in range(10):
        await out.result({"text/plain": "x" * (10 << 20)}, True)
    events = [json.loads(line) for line in sink.lines]
    assert sum(e["type"] == "result" for e in events) == 4  # 4 x 10 MiB fit in 48 MiB
    assert sum(len(line) for line in sink.lines) < server.MAX_RUN_RESULT_BYTES + 4096


def test_strip_ansi() -> None:
    coloured = "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero\x1b]8;;x\x07"
    assert protocol.strip_ansi(coloured) == "ZeroDivisionError: division by zero"


# -- agent + interpreter on this host ------------------------------------------------------


@pytest.fixture
def interpreter(tmp_path: Path) -> Iterator[Path]:
    sock = tmp_path / "code.sock"
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--socket", str(sock),
                             "--cwd", str(work)], start_new_session=True)
    deadline = time.monotonic() + 20
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield sock
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


async def connect_agent(code_socket: Path) -> tuple[AgentClient, subprocess.Popen[bytes]]:
    host_end, agent_end = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pandastack.guest", "--fd", str(agent_end.fileno()),
         "--code-socket", str(code_socket)], pass_fds=[agent_end.fileno()], env=env)
    agent_end.close()
    return await AgentClient.from_socket(host_end, timeout=10), proc


@pytest.fixture
async def agent(interpreter: Path) -> AsyncIterator[AgentClient]:
    client, proc = await connect_agent(interpreter)
    try:
        yield client
    finally:
        await client.close()
        proc.wait(5)


async def run(agent: AgentClient, code: str, **kw: object) -> list[CodeEvent]:
    return [e async for e in agent.run_code(code, **kw)]  # type: ignore[arg-type]


def text(events: list[CodeEvent], kind: str = "stdout") -> str:
    return "".join(e.text for e in events if e.type == kind)


async def test_bash_context_keeps_variables_and_cwd(agent: AgentClient, tmp_path: Path) -> None:
    events = await run(agent, f"X=41; cd {tmp_path}; echo out; echo err >&2",
                       language="bash")
    assert [e.type for e in events][-1] == "end"
    assert (text(events), text(events, "stderr")) == ("out\n", "err\n")
    events = await run(agent, "echo $((X+1)) $(pwd)", language="bash")
    assert text(events) == f"42 {tmp_path}\n"
    assert events[-1].execution_count == 2


async def test_bash_exit_status_and_env(agent: AgentClient) -> None:
    events = await run(agent, "echo $GREETING; exit_with() { return $1; }; exit_with 3",
                       language="bash", env={"GREETING": "hello there"})
    assert text(events) == "hello there\n"
    errors = [e for e in events if e.type == "error"]
    assert [(e.name, e.value) for e in errors] == [("ExitError", "exit status 3")]
    # The variable was for that run only.
    assert text(await run(agent, "echo \"[$GREETING]\"", language="bash")) == "[]\n"


async def test_bash_timeout_kills_the_command_not_the_shell(agent: AgentClient) -> None:
    await run(agent, "KEEP=yes", language="bash")
    t0 = time.monotonic()
    events = await run(agent, "sleep 30", language="bash", timeout=1)
    assert time.monotonic() - t0 < 10
    assert [e.name for e in events if e.type == "error"] == ["TimeoutError"]
    assert text(await run(agent, "echo $KEEP", language="bash")) == "yes\n"


async def test_leaving_a_run_early_interrupts_it(agent: AgentClient) -> None:
    await run(agent, "KEEP=still", language="bash")
    t0 = time.monotonic()
    events = agent.run_code("echo started; sleep 30", language="bash")
    async for event in events:
        assert event.text == "started\n"  # output streams while the command runs
        break
    await events.aclose()
    assert text(await run(agent, "echo $KEEP", language="bash")) == "still\n"
    assert time.monotonic() - t0 < 10


async def test_contexts_are_independent(agent: AgentClient, tmp_path: Path) -> None:
    a = await agent.create_code_context("bash", cwd=str(tmp_path))
    b = await agent.create_code_context("bash")
    assert a["language"] == "bash" and a["cwd"] == str(tmp_path) and a["id"] != b["id"]
    await run(agent, "V=a", context_id=str(a["id"]))
    await run(agent, "V=b", context_id=str(b["id"]))
    assert text(await run(agent, "echo $V $(pwd)", context_id=str(a["id"]))) == \
        f"a {tmp_path}\n"
    assert {c["id"] for c in await agent.list_code_contexts()} >= {a["id"], b["id"]}
    await agent.restart_code_context(str(a["id"]))
    assert text(await run(agent, "echo [$V]", context_id=str(a["id"]))) == "[]\n"
    await agent.delete_code_context(str(a["id"]))
    assert a["id"] not in {c["id"] for c in await agent.list_code_contexts()}
    with pytest.raises(CodeContextNotFound):
        await run(agent, "true", context_id=str(a["id"]))
    with pytest.raises(CodeContextNotFound):
        await agent.delete_code_context("no-such-context")


async def test_unknown_language_and_bad_arguments(agent: AgentClient) -> None:
    with pytest.raises(UnsupportedLanguage, match="cobol"):
        await run(agent, "x", language="cobol")
    with pytest.raises(UnsupportedLanguage):
        await agent.create_code_context("cobol")
    with pytest.raises(ValueError):
        await run(agent, "true", language="bash", env={"NOT-A-NAME": "x"})
    with pytest.raises(ValueError):
        await run(agent, "true", language="bash", timeout=-1)
    with pytest.raises(ValueError, match="lone surrogates"):
        await run(agent, "echo \ud800", language="bash")
    # The connection is still fine afterwards.
    assert text(await run(agent, "echo ok", language="bash")) == "ok\n"


async def test_big_output_streams_through_credits(agent: AgentClient) -> None:
    events = await run(agent, "head -c 5000000 /dev/zero | tr '\\0' x", language="bash")
    assert len(text(events)) == 5_000_000 and events[-1].type == "end"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_javascript_context(agent: AgentClient) -> None:
    events = await run(agent, "let n = 20; console.log('hi'); n * 2 + 2", language="javascript")
    assert text(events) == "hi\n"
    assert [e.data for e in events if e.type == "result"] == [{"text/plain": "42"}]
    events = await run(agent, "n + 1; throw new TypeError('bad')", language="javascript")
    assert [(e.name, e.value) for e in events if e.type == "error"] == [("TypeError", "bad")]
    events = await run(agent, "while (true) {}", language="javascript", timeout=1)
    assert [e.name for e in events if e.type == "error"] == ["TimeoutError"]
    events = await run(agent, "process.env.WHO + n", language="javascript",
                       env={"WHO": "n="})
    assert [e.data for e in events if e.type == "result"] == [{"text/plain": "'n=20'"}]


async def test_python_without_ipykernel_is_unsupported(agent: AgentClient) -> None:
    if importlib.util.find_spec("ipykernel") is not None:
        pytest.skip("this host has ipykernel")
    with pytest.raises(UnsupportedLanguage, match="python is not available"):
        await run(agent, "1")


async def test_no_interpreter_is_unavailable(tmp_path: Path) -> None:
    client, proc = await connect_agent(tmp_path / "missing.sock")
    try:
        with pytest.raises(CodeInterpreterUnavailable, match="no code interpreter"):
            await run(client, "1")
        with pytest.raises(CodeInterpreterUnavailable):
            await client.list_code_contexts()
        assert (await client.exec("echo fine")).stdout == b"fine\n"
    finally:
        await client.close()
        proc.wait(5)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_exec_and_spawn_as_user(tmp_path: Path) -> None:
    client, proc = await connect_agent(tmp_path / "missing.sock")
    try:
        result = await client.exec("id -u; echo $HOME $USER", user="nobody")
        assert result.stdout == b"65534\n/nonexistent nobody\n"
        pid = await client.spawn(["id", "-un"], user="nobody")
        assert (await client.attach(pid, timeout=10)).stdout == b"nobody\n"
        with pytest.raises(GuestOSError, match="no such user"):
            await client.exec("true", user="no-such-user-here")
    finally:
        await client.close()
        proc.wait(5)


def meet(mine: Path, theirs: Path, say: str) -> str:
    """Bash that marks `mine`, then prints `say` only once `theirs` is there (30 s at most):
    two runs that each wait for the other finish only if they run side by side."""
    return (f"touch {mine}; for i in $(seq 600); do [ -e {theirs} ] && break; sleep 0.05; "
            f"done; [ -e {theirs} ] && echo {say}")


async def test_concurrent_runs_in_two_contexts(agent: AgentClient, tmp_path: Path) -> None:
    ctx = await agent.create_code_context("bash")
    a_mark, b_mark = tmp_path / "a", tmp_path / "b"
    a, b = await asyncio.gather(run(agent, meet(a_mark, b_mark, "a"), language="bash"),
                                run(agent, meet(b_mark, a_mark, "b"), context_id=str(ctx["id"])))
    assert (text(a), text(b)) == ("a\n", "b\n"), "the runs did not go side by side"
    with contextlib.suppress(CodeContextNotFound):
        await agent.delete_code_context(str(ctx["id"]))
