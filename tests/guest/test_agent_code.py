"""The `code` op (relay to the code interpreter's unix socket) and `user` on exec (Docker's
forms too: a bare uid, user:group), driven with raw frames against the real agent in --fd
test mode. The interpreter is a stand-in here: a unix socket server in this process that
answers with canned lines."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)


class FakeInterpreter:
    """Accepts connections on a unix socket; records each request line, answers `reply`,
    then waits for the client to close (or closes at once with `linger=False`)."""

    def __init__(self, path: Path, reply: bytes, *, linger: bool = False) -> None:
        self.path = path
        self.reply = reply
        self.linger = linger
        self.requests: list[bytes] = []
        self.closed_by_client = threading.Event()
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as f:
                self.requests.append(f.readline())
                conn.sendall(self.reply)
                if self.linger and conn.recv(1) == b"":
                    self.closed_by_client.set()

    def close(self) -> None:
        self.srv.close()


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "code.sock"


@pytest.fixture
def raw(sock_path: Path, agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw("--code-socket", str(sock_path), cmd=agent_cmd)
    yield r
    r.close()


def test_code_without_interpreter_is_code_unavailable(raw: Raw) -> None:
    raw.hello()
    raw.req("code", 1, b'{"op": "list_contexts"}')
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "code_unavailable")
    assert "no code interpreter" in f.header["message"]


def test_code_relays_request_and_answer(raw: Raw, sock_path: Path) -> None:
    answer = b"".join(json.dumps({"type": "stdout", "text": "x" * 1000}).encode() + b"\n"
                      for _ in range(500)) + b'{"type":"end","execution_count":1}\n'
    fake = FakeInterpreter(sock_path, answer)
    try:
        raw.hello()
        raw.req("code", 1, b'{"op": "run",\n "code": "print(1)"}')
        frames = raw.recv_until(1, "eof")
    finally:
        fake.close()
    assert [f.t for f in frames[:-1]] == ["data"] * (len(frames) - 1)
    body = b"".join(f.payload for f in frames[:-1])
    assert body == answer and frames[-1].header["size"] == len(answer)
    # The request arrives as one compact line, whatever whitespace the host sent.
    assert fake.requests == [b'{"op":"run","code":"print(1)"}\n']


def test_code_cancel_closes_the_connection(raw: Raw, sock_path: Path) -> None:
    fake = FakeInterpreter(sock_path, b'{"type":"stdout","text":"busy"}\n', linger=True)
    try:
        raw.hello()
        raw.req("code", 1, b'{"op": "run", "code": "while True: pass"}')
        f = raw.recv()
        assert (f.t, f.id) == ("data", 1)
        raw.req("cancel", 1)
        # The interpreter sees the connection close: that is how it learns to interrupt.
        assert fake.closed_by_client.wait(5)
        raw.req("ping", 2)
        assert raw.recv().header == {"t": "pong", "id": 2}
    finally:
        fake.close()


@pytest.mark.parametrize("payload", [b"", b"not json", b"[1, 2]", b'{"no_op": 1}'])
def test_code_rejects_a_bad_request(raw: Raw, payload: bytes) -> None:
    raw.hello()
    raw.req("code", 1, payload)
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "EINVAL")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_exec_as_user(raw: Raw) -> None:
    raw.hello()
    raw.req("exec", 1, argv=["sh", "-c", "id -u; id -g; echo $HOME $USER $LOGNAME"],
            user="nobody")
    frames = raw.recv_until(1, "exit")
    out = b"".join(f.payload for f in frames if f.t == "stdout").decode().split("\n")
    assert out[0] == "65534" and out[2] == "/nonexistent nobody nobody"
    assert frames[-1].header["code"] == 0


def test_exec_as_unknown_user_is_einval(raw: Raw) -> None:
    raw.hello()
    raw.req("exec", 1, cmd="true", user="no-such-user-here")
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "EINVAL")
    assert "no-such-user-here" in f.header["message"]
    raw.req("spawn", 2, cmd="true", user="no-such-user-here")
    f = raw.recv()
    assert (f.t, f.header["code"]) == ("error", "EINVAL")


IDS_SCRIPT = 'id -u; id -g; id -G; echo "$HOME|${USER-unset}|${LOGNAME-unset}"'


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
@pytest.mark.parametrize(("user", "want"), [
    # Docker's forms: a uid without a passwd entry (this host has none for 4242) is that
    # bare uid with gid 0 and HOME=/; a group replaces the entry's groups.
    ("4242", ["4242", "0", "0", "/|unset|unset"]),
    ("4242:4243", ["4242", "4243", "4243", "/|unset|unset"]),
    ("4242:staff", ["4242", "50", "50", "/|unset|unset"]),
    ("nobody:staff", ["65534", "50", "50", "/nonexistent|nobody|nobody"]),
    ("65534:1234", ["65534", "1234", "1234", "/nonexistent|nobody|nobody"]),
])
def test_exec_as_user_and_group(raw: Raw, user: str, want: list[str]) -> None:
    raw.hello()
    raw.req("exec", 1, argv=["sh", "-c", IDS_SCRIPT], user=user)
    frames = raw.recv_until(1, "exit")
    out = b"".join(f.payload for f in frames if f.t == "stdout").decode().splitlines()
    assert (out, frames[-1].header["code"]) == (want, 0)


@pytest.mark.parametrize(("user", "message"), [
    ("nobody:no-such-group-here", "no such group: 'no-such-group-here'"),
    ("no-such-user-here:staff", "no such user: 'no-such-user-here'"),
    ("2147483647", "no such user: '2147483647'"),  # past Docker's largest id
])
def test_exec_as_unknown_user_or_group_is_einval(raw: Raw, user: str, message: str) -> None:
    raw.hello()
    for number, op in enumerate(("exec", "spawn", "pty"), 1):
        raw.req(op, number, cmd="true", user=user)
        f = raw.recv()
        assert (f.t, f.header["code"], f.header["message"]) == ("error", "EINVAL", message)
