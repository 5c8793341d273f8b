"""The package's metadata as `pip install` builds it: the license is an SPDX expression with
its file (a `project.license` table made setuptools warn that such builds stop working after
2027-02-18), and the build backend pyproject.toml asks for is one that takes that form.

The metadata is built by the PEP 517 hook pip calls, with this venv's setuptools (the dev
extra's), from a copy of the project's files: no index, and nothing written into the
checkout."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
# The first setuptools that reads `license` as an SPDX string and `license-files`.
SPDX_SETUPTOOLS = Version("77")

HOOK = """
import sys, warnings
from setuptools import build_meta
warnings.simplefilter("always")
print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))
"""


def tree_copy(dst: Path) -> Path:
    dst.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", dst / "src", ignore=ignore)
    return dst


def test_the_license_is_an_spdx_expression_built_without_a_warning(tmp_path: Path) -> None:
    tree, out = tree_copy(tmp_path / "tree"), tmp_path / "meta"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", HOOK, str(out)], cwd=tree, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stdout + proc.stderr
    assert "project.license" not in report and "deprecated" not in report.lower(), report
    dist_info = out / proc.stdout.strip().splitlines()[-1]
    meta = email.message_from_bytes((dist_info / "METADATA").read_bytes())
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["License"] is None  # the old free-text field is gone

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (backend,) = [Requirement(r) for r in pyproject["build-system"]["requires"]
                  if Requirement(r).name == "setuptools"]
    assert not backend.specifier.contains(str(Version("76.1"))), backend
    assert backend.specifier.contains(str(SPDX_SETUPTOOLS)), backend
