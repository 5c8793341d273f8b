"""The guest protocol's version at the handshake (spec/guest-protocol.md §3), against the REAL
reference agent frozen at another version, as one in an older or newer template, snapshot or
hibernation is: below what this host speaks it is refused with GuestIncompatible naming the
rebuild (the API's 409), above it naming the host's upgrade; an older one this host still
speaks is greeted again in its own version and works. No VM needed."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import pandastack
from pandastack.guestproto import frames as P
from pandastack.host.agentlink.client import AgentClient
from pandastack.host.agentlink.handshake import refused_version
from pandastack.hostport.errors import GuestIncompatible
from pandastack.hostport.host_api.codec import status_of
from pandastack.server.web.errors import api_error_of

pytestmark = pytest.mark.timeout(60)

SRC = str(Path(pandastack.__file__).resolve().parents[1])
# The reference agent with its message set's version replaced before it is imported.
FROZEN = ("import sys; import pandastack.guestproto.frames as F; "
          "F.PROTOCOL_VERSION = int(sys.argv[1]); "
          "from pandastack.guest.__main__ import main; sys.exit(main(sys.argv[2:]))")


@contextlib.asynccontextmanager
async def frozen_agent(version: int) -> AsyncIterator[socket.socket]:
    """The host's end of a socket to a reference agent that speaks guest protocol `version`
    only; the agent is reaped on exit."""
    host_end, agent_end = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", FROZEN, str(version), "--fd",
                             str(agent_end.fileno())], pass_fds=[agent_end.fileno()], env=env)
    agent_end.close()
    try:
        yield host_end
    finally:
        host_end.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_a_guest_older_than_the_host_speaks_is_told_to_rebuild_its_template() -> None:
    old = P.OLDEST_PROTOCOL_VERSION - 1
    async with frozen_agent(old) as sock:
        with pytest.raises(GuestIncompatible) as caught:
            await AgentClient.from_socket(sock, timeout=10)
    message = str(caught.value)
    assert f"guest protocol {old}, older than" in message
    assert "rebuild the template" in message and "pandastack template build" in message
    # Not a 503 to retry: the API says conflict, the host API 409, with the same words.
    api_error = api_error_of(caught.value)
    assert api_error is not None and (api_error.status, api_error.code) == (409, "conflict")
    assert "rebuild the template" in api_error.message
    assert status_of(caught.value) == 409


async def test_a_guest_newer_than_the_host_speaks_is_told_to_upgrade_the_host() -> None:
    async with frozen_agent(P.PROTOCOL_VERSION + 1) as sock:
        with pytest.raises(GuestIncompatible, match=r"newer than .* upgrade this host.s agent"):
            await AgentClient.from_socket(sock, timeout=10)


async def test_an_older_guest_the_host_still_speaks_is_greeted_in_its_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose oldest spoken version is below its newest (after a bump) says hello in
    its newest, hears the agent's refusal naming its own, and says hello again in that."""
    old = P.PROTOCOL_VERSION - 1
    monkeypatch.setattr(P, "OLDEST_PROTOCOL_VERSION", old)
    async with frozen_agent(old) as sock:
        client = await AgentClient.from_socket(sock, timeout=10)
        try:
            assert client.guest_protocol == old
            result = await client.exec(["echo", "still here"])
            assert (result.exit_code, result.stdout) == (0, b"still here\n")
        finally:
            await client.close()


async def test_the_current_guest_agrees_on_the_current_version() -> None:
    async with frozen_agent(P.PROTOCOL_VERSION) as sock:
        client = await AgentClient.from_socket(sock, timeout=10)
        try:
            assert client.guest_protocol == P.PROTOCOL_VERSION
        finally:
            await client.close()


def test_the_refusal_of_both_agents_names_their_version() -> None:
    # The reference agent's words (guest/agent.py) and the static agent's (agent.rs).
    assert refused_version("protocol version 2 not supported (want 1)") == 1
    assert refused_version("protocol version None not supported (want 13)") == 13
    assert refused_version("protocol version 2 not supported") is None
    assert refused_version(None) is None
