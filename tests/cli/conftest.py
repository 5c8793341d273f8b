"""CLI unit tests: no network, no VMs. Every test runs with an empty pandastack configuration."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No PANDASTACK_* variables and no config file, whatever the developer's machine has."""
    monkeypatch.delenv("PANDASTACK_API", raising=False)
    monkeypatch.delenv("PANDASTACK_API_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
