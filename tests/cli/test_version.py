"""`pandastack --version` says the version src/pandastack/_version.py gives (the one place it
is written: pyproject.toml, the OpenAPI documents and the guest agent follow it), and
CHANGELOG.md agrees: a release `X.Y.Z` has its section; between releases the version is the
next one's `.dev0`; the changelog's first section is `Unreleased`, above every released one.
That the newest release is a tag of this repository: tests/server/hosts/test_cluster_upgrade.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandastack
from pandastack._version import __version__
from pandastack.guest import __version__ as guest_version

ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
DEV = re.compile(r"(\d+)\.(\d+)\.(\d+)\.dev0")


def released_versions() -> list[str]:
    """The versions CHANGELOG.md has a dated section for, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text()
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, flags=re.MULTILINE)


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def test_version_flag_prints_the_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "pandastack", "--version"], text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pandastack {__version__}"


def test_every_copy_of_the_version_follows_the_one_place() -> None:
    assert pandastack.__version__ == __version__
    # The guest agent reports its own copy in its hello: it must not drift.
    assert guest_version == __version__
    for spec in ("openapi.json", "host-openapi.json"):
        info = json.loads((ROOT / "spec" / spec).read_text())["info"]
        assert info["version"] == __version__, (
            f"spec/{spec} is stale: scripts/gen-openapi.py, python -m pandastack.host.api.spec")
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert 'version = {attr = "pandastack._version.__version__"}' in pyproject


def test_the_changelog_has_the_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    released = released_versions()
    assert headings[0] == "Unreleased" and headings[1:] == released, headings
    assert released == sorted(released, key=as_tuple, reverse=True), released
    if RELEASE.fullmatch(__version__):
        assert __version__ == released[0], "a release's version has the newest section"
    else:
        assert DEV.fullmatch(__version__), f"{__version__!r} is neither X.Y.Z nor X.Y.Z.dev0"
        assert not released or as_tuple(__version__) > as_tuple(released[0]), \
            f"{__version__} is not after the newest release, {released[0]}"
