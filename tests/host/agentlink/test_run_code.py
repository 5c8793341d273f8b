"""run_code on real VMs: the code-interpreter template's Jupyter kernel (warm in the snapshot),
bash contexts, errors, timeouts, independent contexts, fork; `user` on exec.

A cold run builds the code-interpreter image (pip downloads the stack through the host once)
and bakes its template inside the first test."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.errors import (
    CodeContextNotFound,
    CodeInterpreterUnavailable,
    GuestOSError,
    UnsupportedLanguage,
)
from pandastack.hostport.results import CodeEvent

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


async def run(sbx: SandboxHandle, code: str, **kw: object) -> list[CodeEvent]:
    events = [e async for e in sbx.run_code(code, **kw)]  # type: ignore[arg-type]
    assert events and events[-1].type == "end", events
    assert all(e.type != "end" for e in events[:-1])
    return events


def stdout(events: list[CodeEvent]) -> str:
    return "".join(e.text for e in events if e.type == "stdout")


def errors(events: list[CodeEvent]) -> list[CodeEvent]:
    return [e for e in events if e.type == "error"]


def main_result(events: list[CodeEvent]) -> str | None:
    found = [e for e in events if e.type == "result" and e.is_main_result]
    assert len(found) <= 1
    return (found[0].data or {}).get("text/plain") if found else None


# One sandbox of each template serves the module: each test's names are its own, and a
# create (a restore and its first exec) is seconds of a TCG run.
@pytest.fixture(scope="module")
async def sbx(runtime: HostRuntime) -> AsyncIterator[SandboxHandle]:
    handle = await runtime.create(template="code-interpreter")
    yield handle
    await runtime.kill(handle.id)


@pytest.fixture(scope="module")
async def sandbox(runtime: HostRuntime) -> AsyncIterator[SandboxHandle]:
    """The base template's (conftest's `sandbox`, for the module)."""
    handle = await runtime.create()
    yield handle
    await runtime.kill(handle.id)


# The first create after an image change builds the image and bakes the template here.
@pytest.mark.timeout(1800)
async def test_plot_comes_back_as_png(sbx: SandboxHandle) -> None:
    t0 = time.monotonic()
    first = await run(sbx, "6 * 7")
    first_ms = (time.monotonic() - t0) * 1000
    assert main_result(first) == "42" and errors(first) == []
    # The template's warm-up left nothing behind in the namespace (checked here, on the
    # sandbox's first runs, before this test imports plt).
    assert errors(await run(sbx, "plt"))[0].name == "NameError"
    t0 = time.monotonic()
    events = await run(sbx, "import matplotlib.pyplot as plt\n"
                            "plt.plot([1, 4, 9, 16])\nplt.title('squares')\nplt.show()")
    plot_ms = (time.monotonic() - t0) * 1000
    assert errors(events) == []
    images = [e for e in events if e.type == "result" and "image/png" in (e.data or {})]
    assert len(images) == 1 and not images[0].is_main_result
    png = base64.b64decode((images[0].data or {})["image/png"], validate=True)
    assert png.startswith(PNG_MAGIC) and len(png) > 1000
    print(f"\nfirst run_code after create: {first_ms:.0f} ms; plot round trip: "
          f"{plot_ms:.0f} ms ({len(png)} bytes of PNG)")


async def test_rich_results(sbx: SandboxHandle) -> None:
    events = await run(sbx, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    (result,) = [e for e in events if e.type == "result"]
    data = result.data or {}
    assert result.is_main_result and "<table" in data["text/html"] and "a  b" in data["text/plain"]
    events = await run(sbx, "from IPython.display import JSON\nJSON({'k': [1, 2]})")
    (result,) = [e for e in events if e.type == "result"]
    assert '"k"' in (result.data or {})["application/json"]


async def test_exception_has_name_value_and_clean_traceback(sbx: SandboxHandle) -> None:
    events = await run(sbx, "def f():\n    return 1 / 0\nf()")
    (err,) = errors(events)
    assert (err.name, err.value) == ("ZeroDivisionError", "division by zero")
    assert "ZeroDivisionError" in err.traceback and "return 1 / 0" in err.traceback
    assert "\x1b[" not in err.traceback


async def test_state_persists_and_execution_count_grows(sbx: SandboxHandle) -> None:
    a = await run(sbx, "x = 41")
    b = await run(sbx, "x + 1")
    assert main_result(b) == "42"
    assert a[-1].execution_count is not None and b[-1].execution_count == \
        a[-1].execution_count + 1


async def test_timeout_interrupts_the_kernel_and_keeps_its_state(sbx: SandboxHandle) -> None:
    await run(sbx, "kept = 'still here'")
    t0 = time.monotonic()
    events = await run(sbx, "while True: pass", timeout=3)
    took = time.monotonic() - t0
    (err,) = errors(events)
    assert err.name == "TimeoutError" and "interrupted" in err.value
    assert took < 30, took
    assert main_result(await run(sbx, "kept")) == "'still here'"
    assert (await sbx.exec("echo alive", timeout=30)).stdout == b"alive\n"


async def test_stdout_and_results_in_order(sbx: SandboxHandle) -> None:
    events = await run(sbx, "import sys\nfrom IPython.display import display\n"
                            "print('one')\ndisplay('two')\nprint('three')\n"
                            "print('warn', file=sys.stderr)\n'four'")
    seen = [(e.type, e.text or (e.data or {}).get("text/plain", ""), e.is_main_result)
            for e in events[:-1]]
    assert seen == [("stdout", "one\n", False), ("result", "'two'", False),
                    ("stdout", "three\n", False), ("stderr", "warn\n", False),
                    ("result", "'four'", True)]


async def test_env_is_for_one_run(sbx: SandboxHandle) -> None:
    events = await run(sbx, "import os\nos.environ['GREETING']", env={"GREETING": "hi"})
    assert main_result(events) == "'hi'"
    assert main_result(await run(sbx, "os.environ.get('GREETING')")) is None


async def test_two_contexts_are_independent(sbx: SandboxHandle) -> None:
    ctx = await sbx.create_code_context("python", cwd="/tmp")
    assert ctx["language"] == "python" and ctx["cwd"] == "/tmp"
    cid = str(ctx["id"])
    await run(sbx, "v = 'default'")
    await run(sbx, "v = 'other'", context_id=cid)
    assert main_result(await run(sbx, "v")) == "'default'"
    assert main_result(await run(sbx, "import os\n(v, os.getcwd())", context_id=cid)) == \
        "('other', '/tmp')"
    assert cid in {c["id"] for c in await sbx.list_code_contexts()}
    await sbx.restart_code_context(cid)
    assert errors(await run(sbx, "v", context_id=cid))[0].name == "NameError"
    await sbx.delete_code_context(cid)
    with pytest.raises(CodeContextNotFound):
        await run(sbx, "1", context_id=cid)


async def test_bash_context_keeps_variables_and_cwd(sbx: SandboxHandle) -> None:
    await run(sbx, "GREETING=hello; cd /tmp", language="bash")
    events = await run(sbx, "echo $GREETING from $(pwd)", language="bash")
    assert stdout(events) == "hello from /tmp\n" and errors(events) == []
    (err,) = errors(await run(sbx, "false", language="bash"))
    assert (err.name, err.value) == ("ExitError", "exit status 1")


async def test_javascript_runs_beside_python_and_cobol_does_not(sbx: SandboxHandle) -> None:
    # the image has node since E2B's code-interpreter-v1 runs both languages
    await run(sbx, "var greeting = 'hi from node'", language="javascript")
    events = await run(sbx, "console.log(greeting)", language="javascript")
    assert stdout(events) == "hi from node\n" and errors(events) == []
    with pytest.raises(UnsupportedLanguage, match="cobol"):
        await run(sbx, "x", language="cobol")


async def test_fork_child_sees_the_parents_kernel_state(runtime: HostRuntime,
                                                        sbx: SandboxHandle) -> None:
    await run(sbx, "secret = 1234")
    (child,) = await runtime.fork(sbx.id)
    try:
        assert main_result(await run(child, "secret + 1")) == "1235"
        await run(child, "secret = 0")
        assert main_result(await run(sbx, "secret")) == "1234"
    finally:
        await runtime.kill(child.id)


async def test_base_template_has_no_code_interpreter(sandbox: SandboxHandle) -> None:
    with pytest.raises(CodeInterpreterUnavailable):
        await run(sandbox, "1")
    with pytest.raises(CodeInterpreterUnavailable):
        await sandbox.list_code_contexts()


async def test_exec_and_spawn_as_user(sandbox: SandboxHandle) -> None:
    result = await sandbox.exec("id -u; id -g; echo $HOME $USER", timeout=30, user="nobody")
    assert (result.exit_code, result.stdout) == (0, b"65534\n65534\n/nonexistent nobody\n")
    pid = await sandbox.spawn(["id", "-un"], user="nobody")
    assert (await sandbox.attach(pid)).stdout == b"nobody\n"
    assert (await sandbox.exec("id -u", timeout=30)).stdout == b"0\n"
    with pytest.raises(GuestOSError, match="no such user"):
        await sandbox.exec("true", user="no-such-user")
