"""The real agent (``python -m pandastack.guest --fd N``) driven with raw frames."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.guestproto import frames as P

pytestmark = pytest.mark.timeout(60)

SRC = str(Path(P.__file__).resolve().parents[2])


class Raw:
    def __init__(self, *args: str, cmd: list[str] | None = None) -> None:
        """An agent started by ``cmd`` (tests/guest/conftest.py: ``agent_cmd``; the Python
        agent without one) on one end of a socketpair."""
        self.sock, agent_end = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [*(cmd or [sys.executable, "-m", "pandastack.guest"]), "--fd",
             str(agent_end.fileno()), *args],
            pass_fds=[agent_end.fileno()],
            env=env,
        )
        agent_end.close()
        self.sock.settimeout(10)
        self.dec = P.FrameDecoder()

    def close(self) -> None:
        """Close the channel; the agent must then exit by itself (killed and failed if not)."""
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def req(self, t: str, id: int, payload: bytes = b"", **fields: Any) -> None:
        self.send(P.frame(t, id, payload, **fields))

    def recv(self) -> P.Frame:
        while (f := self.dec.next_frame()) is None:
            data = self.sock.recv(1 << 20)
            assert data, "agent closed the channel"
            self.dec.feed(data)
        return f

    def recv_until(self, id: int, t: str) -> list[P.Frame]:
        out = []
        while True:
            f = self.recv()
            if f.id == id:
                out.append(f)
                if f.t == t or f.t == "error":
                    return out

    def hello(self, nonce: str = "n1") -> P.Frame:
        self.req("hello", 0, v=1, nonce=nonce)
        while True:
            f = self.recv()
            if f.t == "hello" and f.header.get("nonce") == nonce:
                return f

    def silent_for(self, seconds: float) -> bool:
        self.sock.settimeout(seconds)
        try:
            return self.sock.recv(1 << 16) == b""
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(10)


@pytest.fixture
def raw(agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw(cmd=agent_cmd)
    yield r
    r.close()


def test_hello_reply(raw: Raw) -> None:
    f = raw.hello("abc")
    assert f.header["v"] == 1 and f.header["pid"] == raw.proc.pid
    assert isinstance(f.header["agent_version"], str)
    raw.req("ping", 1)
    assert raw.recv().header == {"t": "pong", "id": 1}


def test_frames_before_hello_are_ignored(raw: Raw) -> None:
    raw.req("ping", 1)
    assert raw.silent_for(0.3)
    raw.hello()
    raw.req("ping", 2)
    assert raw.recv().id == 2


def test_wrong_version_is_refused(raw: Raw) -> None:
    raw.req("hello", 0, v=99, nonce="x")
    f = raw.recv()
    assert (f.t, f.header["code"], f.header["nonce"]) == ("error", "EPROTONOSUPPORT", "x")
    raw.hello("y")


def test_garbage_before_hello_and_bad_frame_after(raw: Raw) -> None:
    raw.send(os.urandom(5000) + b"PS\x01\x00\xff\xff\xff\xff" + b"PSPSPS")
    raw.hello("first")
    raw.send(b"this is not a frame at all")
    f = raw.recv()
    assert (f.t, f.id, f.header["code"]) == ("error", 0, "EPROTO")
    raw.req("ping", 5)  # no reply: the agent is resyncing and waits for a hello
    assert raw.silent_for(0.3)
    raw.hello("second")
    raw.req("ping", 6)
    assert raw.recv().header == {"t": "pong", "id": 6}


def test_oversized_frame_is_rejected_without_waiting(raw: Raw) -> None:
    raw.hello()
    raw.send(b"PS\x01\x00\x00\x00\x00\x10\x7f\xff\xff\xff")  # claims a 2 GiB payload
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "EPROTO")
    raw.hello("again")


def test_fuzz_never_kills_the_agent(raw: Raw) -> None:
    rnd = random.Random(1234)
    raw.hello()
    types = ["exec", "spawn", "attach", "read_file", "write_file", "list", "stat", "x", "init"]
    junk_values: list[Any] = [None, -1, 2**70, "", "\0", [], {}, True, 1.5, "/nonexistent"]
    for i in range(1, 200):
        fields = {
            k: rnd.choice(junk_values)
            for k in rnd.sample(["cmd", "argv", "path", "pid", "sig", "env", "cwd", "mode"], 3)
        }
        fields["path"] = "/nonexistent/fuzz"
        raw.req(rnd.choice(types), i, os.urandom(rnd.randrange(0, 100)), **fields)
    raw.send(os.urandom(3000))
    raw.hello("after-fuzz")
    raw.req("ping", 10_000)
    while (f := raw.recv()).id != 10_000:
        pass
    assert f.t == "pong"
    assert raw.proc.poll() is None


def test_unknown_and_invalid_requests(raw: Raw) -> None:
    raw.hello()
    raw.req("frobnicate", 1)
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "ENOSYS")
    raw.req("exec", 2, argv="not a list")
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "EINVAL")
    raw.req("stat", 0, path="/")
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "EINVAL")
    raw.req("credit", 77, n=5)  # stray stream frame for no op: dropped silently
    raw.req("ping", 3)
    assert raw.recv().header == {"t": "pong", "id": 3}


def test_exec_of_a_lost_connection_becomes_background(raw: Raw, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # the command ends once the test has seen it running
    raw.hello("one")
    raw.req("exec", 1, cmd=f"echo before; for i in $(seq 600); do [ -e {gate} ] && break; "
                           f"sleep 0.05; done; echo after")
    f = raw.recv()
    assert (f.t, f.payload) == ("stdout", b"before\n")
    raw.hello("two")  # a new host: streams of the old connection are detached
    raw.req("procs", 2)
    f = raw.recv()
    assert f.t == "proc_list"
    procs = json.loads(f.payload)
    assert len(procs) == 1 and procs[0]["background"] and procs[0]["running"]
    pid = procs[0]["pid"]
    gate.touch()
    raw.req("attach", 3, pid=pid)
    frames = raw.recv_until(3, "exit")
    out = b"".join(x.payload for x in frames if x.t == "stdout")
    assert out == b"before\nafter\n"
    assert frames[-1].header["code"] == 0
    assert all(x.id == 3 for x in frames)  # nothing more of the old exec (id 1) arrived


def test_exec_stdout_respects_credit(raw: Raw) -> None:
    raw.hello()
    raw.req("exec", 1, cmd="head -c 5000000 /dev/zero")
    got = 0
    t_end = time.monotonic() + 0.5
    while time.monotonic() < t_end:  # grant nothing: at most the initial window arrives
        raw.sock.settimeout(max(0.01, t_end - time.monotonic()))
        try:
            data = raw.sock.recv(1 << 20)
        except TimeoutError:
            break
        raw.dec.feed(data)
        while (f := raw.dec.next_frame()) is not None:
            got += len(f.payload)
    raw.sock.settimeout(10)
    assert 0 < got <= P.INITIAL_WINDOW
    total = got
    raw.req("credit", 1, n=10_000_000)
    while True:
        f = raw.recv()
        if f.t == "exit":
            break
        total += len(f.payload)
    assert total == 5_000_000 and f.header["code"] == 0


def test_agent_exits_on_eof_in_fd_mode(raw: Raw) -> None:
    raw.hello()
    raw.sock.shutdown(socket.SHUT_WR)
    assert raw.proc.wait(5) == 0
