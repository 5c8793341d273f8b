"""CLI unit tests: no VMs. Every test runs with an empty pandastack configuration; `server` is a
fake-host server on loopback whose admin key the commands use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.live import FakeServer, fake_server


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No PANDASTACK_* variables and no config file, whatever the developer's machine has."""
    monkeypatch.delenv("PANDASTACK_API", raising=False)
    monkeypatch.delenv("PANDASTACK_API_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    with fake_server(tmp_path) as srv:
        monkeypatch.setenv("PANDASTACK_API", srv.url)
        monkeypatch.setenv("PANDASTACK_API_KEY", srv.admin_key)
        yield srv
