"""A template's start command and ready check (templates.start_service), driven through the
REAL agent in --fd test mode on this host: no VM needed. The agent kills what it started when
the connection closes."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.host.agentlink.client import AgentClient
from pandastack.host.templates.builtin import BUILTIN_TEMPLATES, start_service
from pandastack.hostport.errors import SetupError
from pandastack.rules import E2B_DEFAULT_CWD
from pandastack.templatespec import ReadyCheck
from tests.host.agentlink.test_agent_client import local_agent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def agent() -> AsyncIterator[AgentClient]:
    async with local_agent() as client:
        yield client


async def test_file_check_waits_for_the_file(agent: AgentClient, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    pid = await start_service(agent, f"sleep 0.5; touch {ready}; exec sleep 30",
                              ReadyCheck(kind="file", value=str(ready), timeout_seconds=20))
    assert ready.exists()
    assert any(p["pid"] == pid and p["running"] for p in await agent.procs())
    await agent.signal(pid, 9)


async def test_port_check_waits_for_a_listener(agent: AgentClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = (f"import socket, time; time.sleep(0.5); s = socket.socket(); "
              f"s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(30)")
    pid = await start_service(agent, f"exec python3 -c \"{server}\"",
                              ReadyCheck(kind="port", value=str(port), timeout_seconds=20))
    await agent.signal(pid, 9)


async def test_command_check(agent: AgentClient, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    pid = await start_service(agent, f"sleep 0.3; echo up > {flag}; exec sleep 30",
                              ReadyCheck(kind="command", value=f"grep -q up {flag}",
                                         timeout_seconds=20))
    await agent.signal(pid, 9)


async def test_start_command_that_exits_fails_with_its_output(agent: AgentClient) -> None:
    t0 = time.monotonic()
    with pytest.raises(SetupError) as info:
        await start_service(agent, "echo starting; echo 'no config' >&2; exit 3",
                            ReadyCheck(kind="file", value="/nonexistent/ready", timeout_seconds=30))
    message = str(info.value)
    assert "exited with code 3" in message and "file /nonexistent/ready" in message
    assert "starting" in message and "no config" in message
    assert time.monotonic() - t0 < 15  # did not wait for the whole deadline


async def test_check_that_never_passes_times_out(agent: AgentClient) -> None:
    # The deadline leaves a loaded machine time to start the shell: the output so far must
    # be in the message.
    with pytest.raises(SetupError) as info:
        await start_service(agent, "echo still booting; exec sleep 30",
                            ReadyCheck(kind="file", value="/nonexistent/ready",
                                       timeout_seconds=5))
    message = str(info.value)
    assert "was not ready (file /nonexistent/ready) after 5 s" in message
    assert "still booting" in message


def test_builtin_key_parts() -> None:
    # Templates without a start command keep the key they had before start commands existed.
    assert BUILTIN_TEMPLATES["base"].key_parts() == ()
    node = BUILTIN_TEMPLATES["node"]  # javascript contexts: the interpreter runs there too
    assert node.key_parts() == (*node.warmup, f"start:{node.start}",
                                "ready:file:/run/pandastack/code.sock")
    ci = BUILTIN_TEMPLATES["code-interpreter"]
    assert ci.start is not None
    assert ci.ready == ReadyCheck(kind="file", value="/run/pandastack/code.sock")
    parts = ci.key_parts()
    assert f"start:{ci.start}" in parts and any(p.startswith("code:") for p in parts)
    # E2B's default python context is made and warmed before the snapshot too, so adding
    # it (or moving its cwd) rebakes the template.
    assert ci.code_contexts == (E2B_DEFAULT_CWD,)
    assert parts[-1] == f"context:{E2B_DEFAULT_CWD}"
    with pytest.raises(ValueError):
        ReadyCheck(kind="socket", value="/x")  # type: ignore[arg-type]
