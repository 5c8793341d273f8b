"""A background process that never reads its stdin: a `stdin` request by pid answers EAGAIN
after the agent's wait (telling how much went in) instead of blocking until the process ends,
and the agent keeps answering meanwhile and after."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pandastack.guest.execs import STDIN_WAIT_S
from tests.guest.test_agent_raw import Raw

pytestmark = [pytest.mark.timeout(90), pytest.mark.agent_ops("stdin_bound")]


@pytest.fixture
def raw(agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw(cmd=agent_cmd)
    yield r
    r.close()


def test_stdin_to_a_process_that_never_reads_it_is_refused_in_bounded_time(raw: Raw) -> None:
    raw.hello()
    raw.req("spawn", 1, cmd="sleep 60", stdin=True)
    spawned = raw.recv_until(1, "spawned")[-1]
    assert spawned.t == "spawned", spawned
    pid = spawned.header["pid"]
    raw.sock.settimeout(STDIN_WAIT_S + 20)
    started = time.monotonic()
    raw.req("stdin", 2, b"x" * (256 << 10), pid=pid)  # more than the pipe holds
    answer = raw.recv_until(2, "ok")[-1]
    took = time.monotonic() - started
    assert answer.t == "error" and answer.header["code"] == "EAGAIN", answer
    assert "of 262144 bytes written" in answer.header["message"], answer
    assert took < STDIN_WAIT_S + 15, took
    raw.req("ping", 3)  # the agent still answers, and the process is still there
    assert raw.recv_until(3, "pong")[-1].t == "pong"
    raw.req("signal", 4, pid=pid, sig=9)
    assert raw.recv_until(4, "ok")[-1].t == "ok"
