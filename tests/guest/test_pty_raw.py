"""Terminals in the real agent (test mode, on this host), driven with raw frames: the pty is
the process's controlling terminal (size, SIGINT from ^C, SIGWINCH), output survives a
detach, and what a client sends is bounded."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pandastack.guestproto import frames as P
from tests.guest.test_agent_raw import Raw

pytestmark = [pytest.mark.timeout(60), pytest.mark.agent_ops("pty")]


@pytest.fixture
def raw(agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw(cmd=agent_cmd)
    r.hello()
    yield r
    r.req("procs", 9999)
    listing = json.loads(r.recv_until(9999, "proc_list")[-1].payload)
    running = [p["pid"] for p in listing if p["running"]]
    for n, pid in enumerate(running):  # a failed test's terminals must not outlive it
        r.req("signal", 10000 + n, pid=pid, sig=9)
        r.recv_until(10000 + n, "ok")
    r.close()
    assert not running, "a terminal outlived its test"


def open_pty(raw: Raw, op: int, **fields: Any) -> int:
    raw.req("pty", op, **fields)
    f = raw.recv_until(op, "spawned")[-1]
    assert f.t == "spawned", f.header
    pid = f.header["pid"]
    assert isinstance(pid, int)
    return pid


def read_until(raw: Raw, op: int, needle: bytes, seen: bytearray) -> P.Frame | None:
    """Output of attach `op` until `needle` shows up (or its exit frame, returned)."""
    deadline = time.monotonic() + 20
    while needle not in seen:
        assert time.monotonic() < deadline, f"no {needle!r} in {bytes(seen)!r}"
        f = raw.recv()
        if f.id != op:
            continue
        if f.t == "exit":
            return f
        if f.t == "attached":  # first, before any output
            assert not seen and f.header["pid"] > 0, f.header
            continue
        assert f.t == "stdout", f.header
        seen += f.payload
    return None


def has_child(pid: int, name: str) -> bool:
    """Whether `pid` has a child named `name` (test mode: the agent's processes are this
    host's)."""
    return subprocess.run(["pgrep", "-P", str(pid), "-x", name],
                          capture_output=True, check=False).returncode == 0


def wait_not_running(raw: Raw, pid: int, first_id: int) -> None:
    """Until the agent's table lists `pid` as no longer running (10 s at most)."""
    deadline = time.monotonic() + 10
    for id in range(first_id, first_id + 1000):
        raw.req("procs", id)
        listing = json.loads(raw.recv_until(id, "proc_list")[-1].payload)
        if not any(p["pid"] == pid and p["running"] for p in listing):
            return
        assert time.monotonic() < deadline, f"{pid} still listed running"
        time.sleep(0.02)
    raise AssertionError(f"{pid} still listed running")


def test_terminal_size_signals_and_exit(raw: Raw) -> None:
    pid = open_pty(raw, 1, argv=["/bin/sh"], cols=80, rows=24)
    raw.req("pty_attach", 2, pid=pid)
    seen = bytearray()
    raw.req("stdin", 2, b"stty size; tty; echo END$((0+1))\n")
    read_until(raw, 2, b"END1\r\n", seen)
    assert b"24 80" in seen and b"/dev/pts/" in seen
    raw.req("resize", 2, cols=100, rows=30)
    seen.clear()
    raw.req("stdin", 2, b"stty size; echo END$((1+1))\n")
    read_until(raw, 2, b"END2\r\n", seen)
    assert b"30 100" in seen
    seen.clear()
    raw.req("stdin", 2, b"sleep 100\n")
    # ^C before the shell has read the line would flush it unread, and the test would pass
    # without a sleep to interrupt: send it once the sleep runs.
    deadline = time.monotonic() + 20
    while not has_child(pid, "sleep"):
        assert time.monotonic() < deadline, "the shell never started sleep"
        time.sleep(0.02)
    raw.req("stdin", 2, b"\x03")
    raw.req("stdin", 2, b"echo alive$((1+1))\n")
    read_until(raw, 2, b"alive2", seen)
    raw.req("stdin", 2, b"exit 7\n")
    exit_frame = read_until(raw, 2, b"\x00never", seen)
    assert exit_frame is not None and exit_frame.header["code"] == 7


def test_reattach_replays_and_sees_later_output(raw: Raw) -> None:
    pid = open_pty(raw, 1, argv=["/bin/sh"])
    raw.req("pty_attach", 2, pid=pid)
    seen = bytearray()
    raw.req("stdin", 2, b"echo before$((2*3))\n")
    read_until(raw, 2, b"before6", seen)
    raw.req("cancel", 2)
    raw.req("pty_attach", 3, pid=pid)
    again = bytearray()
    read_until(raw, 3, b"before6", again)  # the ring
    raw.req("stdin", 3, b"echo after$((2*4))\n")
    read_until(raw, 3, b"after8", again)
    raw.req("signal", 4, pid=pid, sig=9)
    # The attach's exit may come before the signal's ok (the shell dies at once), so both
    # are read from one loop: waiting for the ok alone would drop that exit.
    signalled: P.Frame | None = None
    exit_frame: P.Frame | None = None
    while signalled is None or exit_frame is None:
        f = raw.recv()
        if f.id == 4:
            signalled = f
        elif f.id == 3 and f.t == "exit":
            exit_frame = f
        elif f.id == 3:
            assert f.t == "stdout", f.header
    assert signalled.t == "ok", signalled.header
    assert exit_frame.header["signal"] == 9, exit_frame.header


def test_bad_requests_are_refused(raw: Raw) -> None:
    raw.req("pty", 1, argv=["/bin/sh"], cols=100000, rows=24)
    assert raw.recv_until(1, "spawned")[-1].header["code"] == "EINVAL"
    raw.req("pty", 2, argv=["/nonexistent/shell"])
    assert raw.recv_until(2, "spawned")[-1].header["code"] == "ENOENT"
    raw.req("spawn", 3, argv=["sleep", "30"])
    plain = raw.recv_until(3, "spawned")[-1].header["pid"]
    raw.req("pty_attach", 4, pid=plain)
    assert raw.recv_until(4, "exit")[-1].header["code"] == "EINVAL"
    raw.req("signal", 5, pid=plain, sig=9)
    raw.recv_until(5, "ok")
    wait_not_running(raw, plain, 6)  # or the fixture would take it for a terminal left over
