"""`pandastack agent`'s own setup: its token file (made private and random when absent, an
open or empty one refused) and its unix socket (0600; a stale one replaced, a live one
left alone)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from pandastack.cli.agent import listening_socket, load_token
from pandastack.cli.main import main
from tests.leftovers import owned_tmpdir


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_token_file_is_made_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "agent.token"
    token = load_token(path)
    assert len(token) >= 32 and mode(path) == 0o600
    assert load_token(path) == token  # the same on the next start
    assert load_token(tmp_path / "other.token") != token


def test_open_or_empty_token_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.token"
    path.write_text("abc\n")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="open to others"):
        load_token(path)
    path.chmod(0o600)
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_token(path)


def test_unix_socket_is_private_and_a_stale_one_is_replaced() -> None:
    directory = owned_tmpdir("pac-")
    path = directory / "agent.sock"
    try:
        first = listening_socket(f"unix:{path}")
        assert mode(path) == 0o600
        first.listen()
        with pytest.raises(ValueError, match="another agent is listening"):
            listening_socket(f"unix:{path}")
        first.close()  # as a SIGKILLed agent leaves it: the file, no listener
        second = listening_socket(f"unix:{path}")
        assert mode(path) == 0o600
        second.close()
        path.unlink()
        path.write_text("not a socket")
        with pytest.raises(ValueError, match="not a socket"):
            listening_socket(f"unix:{path}")
    finally:
        for entry in directory.iterdir():
            entry.unlink()
        directory.rmdir()


def test_tcp_addresses() -> None:
    sock = listening_socket("127.0.0.1:0")
    assert sock.family == socket.AF_INET and sock.getsockname()[0] == "127.0.0.1"
    sock.close()
    with pytest.raises(ValueError, match="expected unix:PATH or HOST:PORT"):
        listening_socket("localhost")


def test_the_command_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    out = capsys.readouterr().out
    assert "--listen" in out and "--token-file" in out
