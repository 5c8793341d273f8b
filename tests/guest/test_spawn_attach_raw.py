"""`spawn_attach` through raw frames, run by both agents (``agent_cmd``): the pid first, then
the output and the exit on the same id, and a process that is a spawn's (by-pid calls reach
it, leaving the op only detaches, `attach` replays it)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from pandastack.guestproto import frames as P
from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def raw(agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw(cmd=agent_cmd)
    r.hello()
    yield r
    r.close()


def output(frames: list[P.Frame], stream: str) -> bytes:
    return b"".join(f.payload for f in frames if f.t == stream)


def listed(raw: Raw, pid: int, id: int) -> dict[str, object]:
    raw.req("procs", id)
    (f,) = raw.recv_until(id, "proc_list")
    assert f.t == "proc_list", f.header
    return next(p for p in json.loads(f.payload) if p["pid"] == pid)


def test_pid_first_then_output_then_exit_and_attach_replays_it(raw: Raw) -> None:
    raw.req("spawn_attach", 1, cmd="echo out; echo err >&2; exit 3")
    frames = raw.recv_until(1, "exit")
    assert frames[0].t == "attached", frames[0].header
    pid = frames[0].header["pid"]
    assert isinstance(pid, int) and pid > 0
    assert {f.t for f in frames[1:-1]} <= {"stdout", "stderr"}
    assert (output(frames, "stdout"), output(frames, "stderr")) == (b"out\n", b"err\n")
    assert (frames[-1].t, frames[-1].header["code"], frames[-1].header["timed_out"]) == \
        ("exit", 3, False)
    # a background process: remembered once finished, its rings replayed by attach
    assert listed(raw, pid, 2)["background"] is True
    raw.req("attach", 3, pid=pid)
    again = raw.recv_until(3, "exit")
    assert again[0].t == "replay"
    assert (output(again, "stdout"), output(again, "stderr")) == (b"out\n", b"err\n")
    assert again[-1].header["code"] == 3


def test_cancel_detaches_and_by_pid_calls_reach_the_process(raw: Raw) -> None:
    raw.req("spawn_attach", 1, argv=["sh", "-c", "read line; echo got $line"])
    (first,) = raw.recv_until(1, "attached")
    pid = first.header["pid"]
    raw.req("cancel", 1)
    assert listed(raw, pid, 2)["running"] is True
    raw.req("stdin", 3, b"hi\n", pid=pid)
    assert raw.recv_until(3, "ok")[-1].t == "ok"
    raw.req("attach", 4, pid=pid)
    frames = raw.recv_until(4, "exit")
    assert output(frames, "stdout") == b"got hi\n"
    assert frames[-1].header["code"] == 0


def test_stdin_false_gives_the_process_none(raw: Raw) -> None:
    raw.req("spawn_attach", 1, cmd="cat; echo done", stdin=False)
    frames = raw.recv_until(1, "exit")
    assert output(frames, "stdout") == b"done\n"
    assert frames[-1].header["code"] == 0


def test_timeout_kills_the_tree(raw: Raw) -> None:
    # Time enough for the shell to start and echo on a loaded machine: the output before
    # the timeout must be kept.
    raw.req("spawn_attach", 1, cmd="echo started; sleep 30", timeout_ms=3000)
    frames = raw.recv_until(1, "exit")
    assert output(frames, "stdout") == b"started\n"
    assert frames[-1].header["timed_out"] is True


def test_a_program_that_cannot_run_is_an_error_without_attached(raw: Raw) -> None:
    raw.req("spawn_attach", 1, argv=["/nonexistent/program"])
    (f,) = raw.recv_until(1, "exit")
    assert (f.t, f.header["code"]) == ("error", "ENOENT")
    raw.req("spawn_attach", 2, argv=["true"], cwd="/nonexistent/dir")
    (f,) = raw.recv_until(2, "exit")
    assert (f.t, f.header["code"]) == ("error", "ENOENT")
