"""`pandastack setup --template NAME`: what `make pytest` runs before its lanes, so that no
test builds a guest image (its builds run there on every `make test`). Here: that a wrong
name fails before any build, not after the minutes of the others."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.cli.main import main


@pytest.fixture
def kept_umask() -> Iterator[None]:
    before = os.umask(0o022)  # setup sets the service's umask in this process
    yield
    os.umask(before)


def test_setup_refuses_an_unknown_template_before_building_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        kept_umask: None) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("PANDASTACK_HOME", str(home))
    assert main(["setup", "--template", "node", "--template", "no-such"]) == 1
    err = capsys.readouterr().err
    assert "unknown template(s) 'no-such'" in err and "node" in err, err
    assert not home.exists(), "nothing may be built or prepared for a refused setup"
