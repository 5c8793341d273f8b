"""Unit tests of the file half of ``init`` (pandastack.guest.sysinit), on the host's own tmp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pandastack.guest import sysinit
from pandastack.guestproto.ops import ENTROPY_BYTES


def test_rewrite_of_the_same_length_keeps_the_inode(tmp_path: Path) -> None:
    path = tmp_path / "machine-id"
    sysinit._write_in_place(str(path), "a" * 32 + "\n")
    inode = os.stat(path).st_ino
    sysinit._write_in_place(str(path), "b" * 32 + "\n")
    assert path.read_text() == "b" * 32 + "\n"
    assert os.stat(path).st_ino == inode


def test_rewrite_drops_a_longer_old_tail(tmp_path: Path) -> None:
    path = tmp_path / "machine-id"
    path.write_text("x" * 100)
    sysinit._write_in_place(str(path), "c" * 32 + "\n")
    assert path.read_text() == "c" * 32 + "\n"


def test_rewrite_creates_a_missing_file_read_only(tmp_path: Path) -> None:
    path = tmp_path / "machine-id"
    before = os.umask(0o022)  # the guest agent's (an in-process host runtime sets 077)
    try:
        sysinit._write_in_place(str(path), "d" * 32 + "\n")
    finally:
        os.umask(before)
    assert path.read_text() == "d" * 32 + "\n"
    assert path.stat().st_mode & 0o777 == 0o444


@pytest.mark.parametrize("hostname", ["a", "sbx-0123abcd", "A1", "x" * 63, "a-b-c"])
def test_valid_hostnames_pass(hostname: str) -> None:
    sysinit.validate(1, hostname, "0" * 32, bytes(ENTROPY_BYTES))


@pytest.mark.parametrize("hostname", ["", "-a", "a-", "x" * 64, "a_b", "a.b", "é", "a b", "a\n"])
def test_invalid_hostnames_fail(hostname: str) -> None:
    with pytest.raises(ValueError, match="hostname"):
        sysinit.validate(1, hostname, "0" * 32, bytes(ENTROPY_BYTES))


@pytest.mark.parametrize("machine_id", ["0" * 31, "0" * 33, "A" * 32, "g" * 32, "0" * 32 + "\n",
                                        "٣" * 32])
def test_invalid_machine_ids_fail(machine_id: str) -> None:
    with pytest.raises(ValueError, match="machine_id"):
        sysinit.validate(1, "a", machine_id, bytes(ENTROPY_BYTES))


@pytest.mark.parametrize("args", [(0, "a", "0" * 32, 64), (True, "a", "0" * 32, 64),
                                  (1, 5, "0" * 32, 64), (1, "a", None, 64), (1, "a", "0" * 32, 63)])
def test_malformed_init_arguments_fail(args: tuple[object, object, object, int]) -> None:
    time_ns, hostname, machine_id, n = args
    with pytest.raises(ValueError):
        sysinit.validate(time_ns, hostname, machine_id, bytes(n))
