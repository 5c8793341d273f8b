"""The commands that write the service's files run with umask 0077 (host/file_modes.py): a
database made by `pandastack keys` before the first `serve` is private too."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.cli.main import main


@pytest.fixture
def open_umask() -> Iterator[None]:
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_keys_creates_a_private_database_and_sets_the_service_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None) -> None:
    db = tmp_path / "new" / "pandastack.db"
    monkeypatch.setenv("PANDASTACK_DB", f"sqlite:///{db}")
    assert main(["keys", "create", "--name", "ops", "--db"]) == 0
    assert os.umask(0o022) == 0o077
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in db.parent.iterdir()} == {0o600}
