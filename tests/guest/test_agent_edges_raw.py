"""Requests at the edges of what the protocol allows, against both agents (``agent_cmd``): ints
past what a system call takes, JSON nested or numbered past the agents' fixed bounds, programs
exec(2) refuses. The two agents answered these differently (ADR 0038's known differences, and
what fuzzing both with the same frames found); each test pins the one answer both give now."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.guestproto import frames as P
from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)

HUGE = 10**40  # more digits than the binary agent's i128 holds


@pytest.fixture
def raw(agent_cmd: list[str], tmp_path: Path) -> Iterator[Raw]:
    # No interpreter listens there: a `code` request that passes its checks is code_unavailable.
    r = Raw("--code-socket", str(tmp_path / "code.sock"), cmd=agent_cmd)
    r.hello()
    yield r
    r.close()


def answer(raw: Raw, id: int) -> P.Frame:
    """The request's last frame (its answer), skipping any before it."""
    while True:
        f = raw.recv()
        if f.id in (id, 0) and f.t not in ("file", "stderr", "stdout", "spawned"):
            return f


def raw_header(raw: Raw, text: str) -> None:
    """A header sent as given: json.dumps could not write some of these (a 4301-digit int)."""
    data = text.encode()
    raw.send(P.PREFIX.pack(P.MAGIC, P.VERSION, 0, len(data), 0) + data)


def test_a_pid_no_process_can_have_is_esrch(raw: Raw) -> None:
    """Not an EIO quoting Python's OverflowError: kill(2)'s own answer for no such process."""
    for n, pid in enumerate([2**31, 2**64, HUGE], start=1):
        raw.req("signal", n, pid=pid, sig=0)
        f = answer(raw, n)
        assert (f.t, f.header["code"], f.header["message"]) == ("error", "ESRCH",
                                                                 "No such process"), pid


@pytest.mark.parametrize("t", ["attach", "stdin", "stdin_eof", "pty_attach"])
def test_a_managed_pid_out_of_range_is_esrch_unquoted(raw: Raw, t: str) -> None:
    raw.req(t, 1, pid=HUGE)
    f = answer(raw, 1)
    assert (f.t, f.header["code"], f.header["message"]) == (
        "error", "ESRCH", "no managed process (pid out of range)")
    raw.req(t, 2, pid=2**31 - 1)  # the largest pid_t is still quoted
    assert answer(raw, 2).header["message"] == f"no managed process {2**31 - 1}"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("depth", "code"), [(511, "code_unavailable"), (512, "EINVAL"),
                                             (2000, "EINVAL")])
def test_a_code_request_nested_too_deeply_is_einval(raw: Raw, depth: int, code: str) -> None:
    """The request object is one level: 511 arrays in it make 512, the most either agent
    takes. Deeper was EINVAL from the binary and an EIO quoting a RecursionError (past ~990
    levels) or a relay (below) from the reference."""
    raw.req("code", 1, f'{{"op":"run","a":{nested(depth)}}}'.encode())
    f = answer(raw, 1)
    assert (f.t, f.header["code"]) == ("error", code)
    if code == "EINVAL":
        assert f.header["message"] == "code request payload is not JSON"


@pytest.mark.parametrize("payload", [
    '{"op":"run"}'.encode("utf-16"),  # json.loads guessed the encoding from bytes
    b'\xef\xbb\xbf{"op":"run"}',
])
def test_a_code_request_that_is_not_utf8_is_einval(raw: Raw, payload: bytes) -> None:
    raw.req("code", 1, payload)
    f = answer(raw, 1)
    assert (f.t, f.header["code"]) == ("error", "EINVAL")


def test_header_nesting_bound_is_the_same_in_both(raw: Raw) -> None:
    """512 levels (the header object and 511 arrays) are a frame, 513 an invalid header: the
    reference took up to its interpreter's recursion limit, the binary 512."""
    raw_header(raw, f'{{"t":"ping","id":1,"a":{nested(511)}}}')
    assert answer(raw, 1).t == "pong"
    raw_header(raw, f'{{"t":"ping","id":2,"a":{nested(512)}}}')
    f = answer(raw, 2)
    assert (f.t, f.id, f.header["code"]) == ("error", 0, "EPROTO")
    assert "nested too deeply" in f.header["message"]
    raw.hello("again")
    raw.req("ping", 3)
    assert answer(raw, 3).t == "pong"


def test_header_integer_digit_bound_is_the_same_in_both(raw: Raw) -> None:
    """Python refuses ints of more than 4300 digits (and its message named a Python setting);
    the binary took any (saturated). Both refuse them now, in the same words."""
    raw_header(raw, '{"t":"ping","id":1,"n":' + "9" * 4300 + "}")
    assert answer(raw, 1).t == "pong"
    raw_header(raw, '{"t":"ping","id":2,"n":-' + "9" * 4301 + "}")
    f = answer(raw, 2)
    assert (f.t, f.id, f.header["code"]) == ("error", 0, "EPROTO")
    assert f.header["message"] == "header is not UTF-8 JSON: JSON integer longer than 4300 digits"
    raw.hello("again")


def test_read_offset_past_off_t_is_einval(raw: Raw, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    raw.req("read_file", 1, path=str(path), offset=2**63)
    f = answer(raw, 1)
    assert (f.t, f.header["code"], f.header.get("path")) == ("error", "EINVAL", str(path))


def test_a_timeout_too_long_to_wait_leaves_later_timeouts_working(raw: Raw) -> None:
    """A timeout_ms near 2**64 ended the reference's watchdog thread (OverflowError in its
    timed wait), so no later exec ever timed out."""
    raw.req("exec", 1, argv=["true"], timeout_ms=2**64)
    assert answer(raw, 1).header["timed_out"] is False
    raw.req("exec", 2, argv=["sleep", "30"], timeout_ms=300)
    f = answer(raw, 2)
    assert (f.t, f.header["timed_out"]) == ("exit", True)


@pytest.fixture
def no_shebang(tmp_path: Path) -> Path:
    """An executable file exec(2) cannot run (ENOEXEC): no `#!` line, not ELF."""
    path = tmp_path / "script"
    path.write_text("exit 0\n")
    path.chmod(0o755)
    return path


def test_exec_of_a_file_without_interpreter_line_is_126(raw: Raw, no_shebang: Path) -> None:
    """execve(2), not execvp(3): the binary (std's Command) ran such a file through /bin/sh,
    the reference (and spec §5) answers 126."""
    raw.req("exec", 1, argv=[str(no_shebang)])
    frames = raw.recv_until(1, "exit")
    err = b"".join(f.payload for f in frames if f.t == "stderr")
    assert frames[-1].header["code"] == 126
    assert err == f"pandastack-agent: {no_shebang}: Exec format error\n".encode()
    # Through PATH as well: the search tries each entry as subprocess does.
    raw.req("exec", 2, argv=[no_shebang.name], env={"PATH": f"/nonexistent:{no_shebang.parent}"})
    assert raw.recv_until(2, "exit")[-1].header["code"] == 126


@pytest.mark.agent_ops("pty")
def test_pty_errors_name_their_path(raw: Raw, no_shebang: Path, tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str, str, str]] = [
        ({"argv": [str(no_shebang)]}, "ENOEXEC", "Exec format error", str(no_shebang)),
        ({"argv": [str(tmp_path)]}, "EACCES", "Permission denied", str(tmp_path)),
        ({"argv": ["true"], "cwd": str(tmp_path / "gone")}, "ENOENT",
         f"{tmp_path / 'gone'}: No such file or directory", str(tmp_path / "gone")),
    ]
    for n, (fields, code, message, path) in enumerate(cases, start=1):
        raw.req("pty", n, **fields)
        f = answer(raw, n)
        assert (f.t, f.header["code"], f.header["message"], f.header.get("path")) == (
            "error", code, message, path), fields

