"""The operator's key file and the sealing of team secrets (server/registries/sealing.py): a
round trip, a value that opens only with its key and in its own row, and key files that are
missing, open to others, malformed, or already there (never overwritten)."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from pandastack.server.registries.sealing import (
    KeyFileError,
    SecretBox,
    UnsealError,
    load_key,
    make_key_file,
)

PASSWORD = "correct horse battery staple"


def test_a_sealed_password_opens_with_its_key_in_its_own_row_only(tmp_path: Path) -> None:
    key_file = tmp_path / "encryption.key"
    assert make_key_file(key_file)
    box = load_key(key_file)
    sealed = box.seal(PASSWORD, "team-a\0ghcr.io")
    assert PASSWORD not in sealed and PASSWORD.encode() not in base64.b64decode(sealed[3:])
    assert box.open(sealed, "team-a\0ghcr.io") == PASSWORD
    # A fresh nonce each time: equal passwords do not look equal in the table.
    assert box.seal(PASSWORD, "team-a\0ghcr.io") != sealed
    with pytest.raises(UnsealError):  # copied into another team's row
        box.open(sealed, "team-b\0ghcr.io")
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(UnsealError):
        box.open(tampered, "team-a\0ghcr.io")
    assert PASSWORD not in repr(box) and box.key_id in repr(box)


def test_another_key_file_does_not_open_it(tmp_path: Path) -> None:
    first, second = tmp_path / "one.key", tmp_path / "two.key"
    make_key_file(first)
    make_key_file(second)
    sealed = load_key(first).seal(PASSWORD, "row")
    other = load_key(second)
    assert other.key_id != load_key(first).key_id
    with pytest.raises(UnsealError, match="does not open with this key"):
        other.open(sealed, "row")


def test_the_key_file_is_private_and_never_replaced(tmp_path: Path) -> None:
    key_file = tmp_path / "home" / "encryption.key"
    old_umask = os.umask(0)  # a permissive umask must not widen it
    try:
        assert make_key_file(key_file)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    made = key_file.read_bytes()
    assert len(base64.b64decode(made.strip())) == 32
    assert not make_key_file(key_file)  # `pandastack setup` again keeps it
    assert key_file.read_bytes() == made


def test_key_files_that_are_not_usable_say_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.key"
    with pytest.raises(KeyFileError, match=r"no encryption key at .*run `pandastack setup`"):
        load_key(missing)
    key_file = tmp_path / "open.key"
    make_key_file(key_file)
    key_file.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"readable by others .*chmod 600"):
        load_key(key_file)
    key_file.chmod(0o600)
    key_file.write_text("not base64 at all!\n")
    with pytest.raises(KeyFileError, match="not 32 bytes of base64"):
        load_key(key_file)
    key_file.write_text(base64.b64encode(b"short").decode())
    with pytest.raises(KeyFileError, match="not 32 bytes"):
        load_key(key_file)
    link = tmp_path / "link.key"
    link.symlink_to(key_file)
    with pytest.raises(KeyFileError, match="cannot be read"):
        load_key(link)


def test_a_box_needs_a_whole_key() -> None:
    with pytest.raises(ValueError):
        SecretBox(b"x" * 16)
