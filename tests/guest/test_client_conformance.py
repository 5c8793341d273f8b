"""The host client's tests of the real agent (tests/host/agentlink: exec, files, streams,
watch), run again against the binary agent (guest-agent/, ADR 0038): the client there is the
protocol's reference user, so what it accepts from the Python agent it must accept from the
binary.

Those modules start the Python agent through ``test_agent_client.start_agent``; here an
autouse fixture points that at the binary for each test collected below. Their tests against
fake guests (hostile bytes) do not involve an agent and are not repeated."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.host.agentlink import test_agent_client, test_agent_streams, test_watch_client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _binary_agent(binary_agent: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def start_agent() -> tuple[socket.socket, subprocess.Popen[bytes]]:
        host_end, agent_end = socket.socketpair()
        proc = subprocess.Popen([binary_agent, "--fd", str(agent_end.fileno())],
                                pass_fds=[agent_end.fileno()], env=dict(os.environ))
        agent_end.close()
        return host_end, proc

    monkeypatch.setattr(test_agent_client, "start_agent", start_agent)
    yield


def _uses_real_agent(fn: Callable[..., Any]) -> bool:
    params = inspect.signature(fn).parameters
    return "agent" in params or "start_agent" in inspect.getsource(fn)


agent = test_agent_client.agent
for _module in (test_agent_client, test_agent_streams, test_watch_client):
    for _name, _fn in vars(_module).items():
        if (_name.startswith("test_") and inspect.isfunction(_fn)
                and _fn.__module__ == _module.__name__ and _uses_real_agent(_fn)):
            globals()[f"{_name}__{_module.__name__.rsplit('.', 1)[-1]}"] = _fn


def test_the_agent_started_here_is_the_binary(binary_agent: str) -> None:
    sock, proc = test_agent_client.start_agent()
    try:
        assert os.readlink(f"/proc/{proc.pid}/exe") == os.path.realpath(binary_agent)
    finally:
        sock.close()
        assert proc.wait(5) == 0
