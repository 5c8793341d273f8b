"""`pandastack --version` says the version pyproject.toml gives the package, and CHANGELOG.md
has an entry for that version."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pandastack

ROOT = Path(__file__).resolve().parents[2]


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_version_flag_prints_the_project_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "pandastack", "--version"], text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pandastack {project_version()}"
    # The agent reports pandastack.__version__ to the registry (`pandastack hosts`): the two
    # must not drift apart.
    assert pandastack.__version__ == project_version()


def test_changelog_has_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert project_version() in headings[1:], headings
