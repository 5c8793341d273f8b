"""`sbx.run_code` against a live server and a real code-interpreter sandbox: the loop agents
run (the model writes Python, it runs, the traceback comes back, the next try sees the state)."""

from __future__ import annotations

import asyncio

import pytest

from pandastack import AsyncSandbox, CodeEvent, ConflictError, NotFoundError, Sandbox
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.timeout(1500)]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = """\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
plt.show()
"""


def test_run_code_loop(live_server: LiveServer) -> None:
    with Sandbox.create(template="code-interpreter", ttl_seconds=600,
                        api_url=live_server.api_url, api_key=live_server.api_key) as sbx:
        first = sbx.run_code("x = 6 * 7\nprint('hello')\nx")
        assert first.error is None, first.error
        assert first.stdout == "hello\n"
        assert first.text == "42"

        again = sbx.run_code("x + 1")  # state persists between calls
        assert again.text == "43"

        plot = sbx.run_code(PLOT)
        pngs = [r.png_bytes() for r in plot.results if r.png is not None]
        assert pngs and pngs[0] is not None and pngs[0].startswith(PNG_MAGIC), plot

        frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert frame.results and frame.results[0].html and "<table" in frame.results[0].html

        failed = sbx.run_code("def f():\n    return 1 / 0\nf()")
        assert failed.error is not None
        assert failed.error.name == "ZeroDivisionError"
        assert "division by zero" in failed.error.value
        assert "f()" in failed.error.traceback and "\x1b[" not in failed.error.traceback

        timed_out = sbx.run_code("import time\nwhile True:\n    time.sleep(0.1)",
                                 timeout_seconds=3)
        assert timed_out.error is not None and timed_out.error.name == "TimeoutError"
        assert sbx.run_code("x").text == "42"  # the kernel was interrupted, not lost

        events: list[CodeEvent] = []
        streamed = sbx.run_code("print('a')\nimport sys; print('b', file=sys.stderr)\n7",
                                on_event=events.append)
        assert [e.type for e in events] == ["stdout", "stderr", "result", "end"]
        assert streamed.stdout == "a\n" and streamed.stderr == "b\n" and streamed.text == "7"

        ctx = sbx.code.create_context()
        assert sbx.run_code("x = 'other'", context=ctx).error is None
        assert sbx.run_code("x").text == "42"  # the default context is untouched
        assert sbx.run_code("x", context=ctx).text == "'other'"
        assert ctx.id in {c.id for c in sbx.code.list_contexts()}
        sbx.code.remove_context(ctx)
        with pytest.raises(NotFoundError):
            sbx.run_code("1", context=ctx)

        bash = sbx.run_code("cd /tmp && export GREETING=hi", language="bash")
        assert bash.error is None, bash.error
        assert sbx.run_code("echo $GREETING $(pwd)", language="bash").stdout == "hi /tmp\n"

        streamed_events = list(sbx.code.stream("for i in range(3): print(i)"))
        assert streamed_events[-1].type == "end"
        assert "".join(e.text for e in streamed_events if e.type == "stdout") == "0\n1\n2\n"


def test_run_code_needs_a_code_interpreter(live_server: LiveServer) -> None:
    with Sandbox.create(template="base", ttl_seconds=300, api_url=live_server.api_url,
                        api_key=live_server.api_key) as sbx, pytest.raises(ConflictError):
        sbx.run_code("1 + 1")


def test_async_run_code(live_server: LiveServer) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(template="code-interpreter", ttl_seconds=300,
                                        api_url=live_server.api_url,
                                        api_key=live_server.api_key)
        async with sbx:
            assert (await sbx.run_code("21 * 2")).text == "42"
            events = [e async for e in sbx.code.stream("print('x')")]
            assert [e.type for e in events] == ["stdout", "end"]
    asyncio.run(main())
