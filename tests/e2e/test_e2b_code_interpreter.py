"""E2B's code interpreter SDK (`e2b-code-interpreter` 2.11.5 on `e2b` 2.63.0), unchanged,
against a live server and one real sandbox of E2B's `code-interpreter-v1` template (our
code-interpreter): state across runs, streamed stdout and stderr, a matplotlib PNG (make
soak), an exception, contexts created, listed, restarted and deleted, env vars; sync, then
async on the same sandbox. The SDK sees only what a user sets: the API URL, the sandbox URL,
the key.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, OutputMessage, Result, Sandbox

from pandastack import Sandbox as OurSandbox
from pandastack.rules import E2B_DEFAULT_CWD
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.timeout(1500)]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = """\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""
# Prints, then waits (bounded) for a file the reader's stdout callback creates on seeing the
# first line: a stream held back until the run ends never gets there.
WAITS_FOR_READER = """\
import os, sys, time
print("first", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists("/tmp/e2b-reader-saw-first") and time.monotonic() < deadline:
    time.sleep(0.05)
print("second" if os.path.exists("/tmp/e2b-reader-saw-first") else "never saw the reader")
print("to stderr", file=sys.stderr)
"""


def e2b_opts(server: LiveServer) -> dict[str, Any]:
    return server.e2b()


@pytest.fixture(scope="module")
def sbx(live_server: LiveServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=900, envs={"FROM_CREATE": "created"},
                             **e2b_opts(live_server))  # template code-interpreter-v1
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_state_persists_across_runs(sbx: Sandbox) -> None:
    first = sbx.run_code("x = 1")
    assert first.error is None and first.results == [], first
    seen: list[Result] = []
    again = sbx.run_code("x + 1", on_result=seen.append)
    assert again.error is None, again.error
    assert again.text == "2"
    assert [r.text for r in seen] == [r.text for r in again.results] == ["2"]
    assert again.execution_count is not None and first.execution_count is not None
    assert again.execution_count == first.execution_count + 1
    assert sbx.run_code("'quoted'").text == "quoted"  # E2B shows a str without its quotes


def test_the_default_context_runs_in_the_users_home(sbx: Sandbox) -> None:
    # as on E2B: what run_code writes by a relative name is where files.read looks
    assert sbx.run_code("open('from-code.txt', 'w').write('hi')").error is None
    assert sbx.files.read("from-code.txt") == "hi"
    # A context made without a cwd starts in the home too: test_async_sdk makes that one
    # (each context is a kernel started cold, ~6 s under TCG).


def test_a_new_sandbox_has_e2bs_default_context_warm(live_server: LiveServer) -> None:
    # The template made E2B's default python context and warmed it before its snapshot:
    # it is there before any run, and the first run finds the stack already imported
    # (a kernel started on that run would be cold: seconds under TCG, no pandas loaded).
    fresh = Sandbox.create(timeout=300, **e2b_opts(live_server))
    try:
        before = [c for c in fresh.list_code_contexts() if c.cwd == E2B_DEFAULT_CWD]
        assert [c.language for c in before] == ["python"], fresh.list_code_contexts()
        execution = fresh.run_code("import os, sys; ('pandas' in sys.modules, os.getcwd())")
        assert execution.error is None, execution.error
        assert execution.text == "(True, '/home/user')"
        after = [c.id for c in fresh.list_code_contexts() if c.cwd == E2B_DEFAULT_CWD]
        assert after == [before[0].id]
    finally:
        fresh.kill()


def test_stdout_and_stderr_stream_to_callbacks(sbx: Sandbox, live_server: LiveServer) -> None:
    ours = OurSandbox.connect(sbx.sandbox_id, api_url=live_server.api_url,
                              api_key=live_server.api_key)
    stdout: list[OutputMessage] = []
    stderr: list[OutputMessage] = []

    def on_stdout(message: OutputMessage) -> None:
        stdout.append(message)
        if message.line == "first\n":
            ours.files.write("/tmp/e2b-reader-saw-first", "1")

    execution = sbx.run_code(WAITS_FOR_READER, on_stdout=on_stdout, on_stderr=stderr.append)
    assert execution.error is None, execution.error
    assert [m.line for m in stdout] == ["first\n", "second\n"]
    assert [m.line for m in stderr] == ["to stderr\n"]
    assert all(isinstance(m.timestamp, int) and not m.error for m in stdout)
    assert stderr[0].error
    assert execution.logs.stdout == ["first\n", "second\n"]
    assert execution.logs.stderr == ["to stderr\n"]


# `make soak` only: a chart's PNG on the wire is what tests/e2e/test_e2b_sdk_versions.py's
# clients (E2B's Python and JavaScript SDKs) check in this template, and tests/e2e/
# test_mcp.py and test_run_code.py through our own; on_result is checked above. Importing
# matplotlib in a guest under TCG: 34 s of a loaded run.
@pytest.mark.soak
def test_a_matplotlib_figure_is_a_png(sbx: Sandbox) -> None:
    seen: list[Result] = []
    execution = sbx.run_code(PLOT, on_result=seen.append)
    assert execution.error is None, execution.error
    pngs = [r.png for r in execution.results if r.png]
    assert pngs, execution.results
    assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)
    assert [r.png for r in seen] == [r.png for r in execution.results]


def test_an_exception_is_execution_error(sbx: Sandbox) -> None:
    errors: list[Any] = []
    execution = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "f()" in execution.error.traceback
    assert errors == [execution.error]


def test_contexts_created_listed_restarted_deleted(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(cwd="/tmp", language="python")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    listed = sbx.list_code_contexts()
    assert [(c.id, c.language, c.cwd) for c in listed if c.id == ctx.id] == [
        (ctx.id, "python", "/tmp")]

    assert sbx.run_code("y = 5\nimport os\nos.getcwd()", context=ctx).text == "/tmp"
    assert sbx.run_code("y", context=ctx).text == "5"
    elsewhere = sbx.run_code("y")  # the default context has its own state
    assert elsewhere.error is not None and elsewhere.error.name == "NameError"

    sbx.restart_code_context(ctx)
    gone = sbx.run_code("y", context=ctx)
    assert gone.error is not None and gone.error.name == "NameError", gone

    sbx.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        sbx.restart_code_context(ctx.id)


def test_env_vars_apply_to_one_run_over_the_sandboxs(sbx: Sandbox) -> None:
    with_env = sbx.run_code("import os; os.getenv('FOO')", envs={"FOO": "bar"})
    assert with_env.text == "bar"
    assert sbx.run_code("import os; os.getenv('FOO', 'unset')").text == "unset"
    assert sbx.run_code("import os; os.getenv('FROM_CREATE')").text == "created"
    over = sbx.run_code("import os; os.getenv('FROM_CREATE')", envs={"FROM_CREATE": "run"})
    assert over.text == "run"
    assert sbx.run_code("echo $FROM_CREATE", language="bash").logs.stdout == ["created\n"]


def test_javascript_keeps_its_state(sbx: Sandbox) -> None:
    # code-interpreter-v1 runs javascript beside python, as E2B's does
    assert sbx.run_code("var n = 20", language="js").error is None
    execution = sbx.run_code("console.log(n + 1)", language="js")
    assert execution.error is None and execution.logs.stdout == ["21\n"], execution


def test_bash_runs_in_its_own_context(sbx: Sandbox) -> None:
    execution = sbx.run_code("GREETING=hi; echo $GREETING", language="bash")
    assert execution.error is None and execution.logs.stdout == ["hi\n"], execution
    assert sbx.run_code("echo again $GREETING", language="bash").logs.stdout == [
        "again hi\n"]
    assert sbx.list_code_contexts()  # the default contexts are listed too


def test_a_kill_during_a_run_ends_it_as_a_timeout(live_server: LiveServer) -> None:
    victim = Sandbox.create(timeout=300, **e2b_opts(live_server))
    ours = OurSandbox.connect(victim.sandbox_id, api_url=live_server.api_url,
                              api_key=live_server.api_key)

    def kill_once_running() -> None:
        deadline = time.monotonic() + 300
        while not ours.files.exists("/tmp/running") and time.monotonic() < deadline:
            time.sleep(0.1)
        victim.kill()

    killer = threading.Thread(target=kill_once_running)
    killer.start()
    try:
        execution = victim.run_code("open('/tmp/running', 'w').close()\n"
                                    "import time\ntime.sleep(600)")
    except TimeoutException as e:  # killed before the run said anything: E2B's 502
        assert "sandbox was killed while the request was in progress" in str(e), e
    else:  # killed after the answer began (a loaded host): the run's last word
        assert execution.error is not None, execution
        assert execution.error.name == "UnexpectedEndOfExecution", execution.error
        assert "sandbox was killed" in execution.error.value
    finally:
        killer.join()


async def test_async_sdk(sbx: Sandbox, live_server: LiveServer) -> None:
    asbx = await AsyncSandbox.connect(sbx.sandbox_id, **e2b_opts(live_server))
    await asbx.run_code("z = 20")
    lines: list[str] = []

    async def on_stdout(message: OutputMessage) -> None:
        lines.append(message.line)

    execution = await asbx.run_code("print(z + 1)\nz * 2", on_stdout=on_stdout)
    assert execution.error is None, execution.error
    assert lines == ["21\n"] and execution.text == "40"

    failed = await asbx.run_code("raise ValueError('nope')")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ValueError", "nope")

    ctx = await asbx.create_code_context()  # no language, no cwd: python, E2B's home
    assert ctx.cwd == "/home/user"
    assert ctx.id in [c.id for c in await asbx.list_code_contexts()]
    made_here = await asbx.run_code("import os\nw = 1\n(w, os.getcwd())", context=ctx)
    assert made_here.text == "(1, '/home/user')", made_here
    await asbx.remove_code_context(ctx)
    with pytest.raises(NotFoundException):
        await asbx.run_code("1", context=ctx)
