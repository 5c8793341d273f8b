"""Unit tests of the file half of ``init`` (pandastack.guest.sysinit), on the host's own tmp."""

from __future__ import annotations

import os
from pathlib import Path

from pandastack.guest import sysinit


def test_machine_id_path_follows_the_link(tmp_path: Path) -> None:
    target = tmp_path / "run" / "machine-id"
    target.parent.mkdir()
    target.write_text("")
    link = tmp_path / "etc-machine-id"
    link.symlink_to(target)
    assert sysinit.machine_id_path(str(link)) == str(target)


def test_machine_id_path_of_a_plain_file_is_itself(tmp_path: Path) -> None:
    plain = tmp_path / "machine-id"
    plain.write_text("")
    assert sysinit.machine_id_path(str(plain)) == str(plain)


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
    sysinit._write_in_place(str(path), "d" * 32 + "\n")
    assert path.read_text() == "d" * 32 + "\n"
    assert path.stat().st_mode & 0o777 == 0o444
