"""`AgentClient.listing` (grep and glob) against the real reference agent: answers bigger than the
agent's first credit window arrive whole, and guest errors become GuestOSError."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.guestproto.frames import INITIAL_WINDOW
from pandastack.guestproto.ops import GREP_MAX_LINE_BYTES, GREP_MAX_MATCHES, GlobResult, GrepMatch
from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import GuestOSError
from tests.host.agentlink.test_agent_client import local_agent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def agent() -> AsyncIterator[AgentClient]:
    async with local_agent() as client:
        yield client


async def test_grep_an_answer_past_the_credit_window(agent: AgentClient, tmp_path: Path) -> None:
    long_line = b"needle" + b"z" * 2 * GREP_MAX_LINE_BYTES + b"\n"
    (tmp_path / ("f" * 200)).write_bytes(long_line * (GREP_MAX_MATCHES + 5))
    got = await agent.listing(
        "grep", {"path": str(tmp_path), "pattern": "NEEDLE", "ignore_case": True})
    assert got.truncated and len(got.matches) == GREP_MAX_MATCHES
    assert sum(len(m.text) + len(m.path) for m in got.matches) > INITIAL_WINDOW
    assert got.matches[1] == GrepMatch(str(tmp_path / ("f" * 200)), 2,
                                       long_line[:GREP_MAX_LINE_BYTES].decode())


async def test_glob_through_the_client(agent: AgentClient, tmp_path: Path) -> None:
    for name in ("a.py", "b/c.py", "b/d.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).touch()
    assert await agent.listing("glob", {"path": str(tmp_path), "pattern": "**/*.py"}) == GlobResult(
        [str(tmp_path / "a.py"), str(tmp_path / "b" / "c.py")], truncated=False)


async def test_guest_errors_are_guest_os_errors(agent: AgentClient, tmp_path: Path) -> None:
    with pytest.raises(GuestOSError) as e:
        await agent.listing("grep", {"path": str(tmp_path / "missing"), "pattern": "x"})
    assert (e.value.errno_name, e.value.path) == ("ENOENT", str(tmp_path / "missing"))
    with pytest.raises(GuestOSError) as e:
        await agent.listing("glob", {"path": str(tmp_path), "pattern": "x" * 1025})
    assert e.value.errno_name == "EINVAL" and "pattern" in str(e.value)
