"""An installed server (`pip install 'pandastack[server]'` from a wheel, no checkout) builds
the binary agent its images run: the wheel carries scripts/build-guest-agent.sh and
guest-agent/src/*.rs as data files, and the build finds them through the installed files'
record. Built here from a copy of the tree, installed into a throwaway venv (never this
one: pip would replace its editable install), and built for real by rustc."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from pandastack._version import __version__
from tests.guest.conftest import REPO

pytestmark = pytest.mark.timeout(600)

SHARE = "share/pandastack"


def tree_copy(dst: Path) -> Path:
    """What a wheel is built from; building in the checkout would leave build/ in it."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", dst / "src", ignore=ignore)
    shutil.copytree(REPO / "guest-agent", dst / "guest-agent", ignore=ignore)
    shutil.copytree(REPO / "deploy", dst / "deploy", ignore=ignore)  # the wheel's data-files
    (dst / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "build-guest-agent.sh", dst / "scripts")
    return dst


def build_wheel(src: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)]
    # With a wheel-capable setuptools here no index is needed at all; else pip builds in
    # isolation (setuptools and wheel from the configured index or pip's cache).
    if importlib.util.find_spec("wheel") is not None:
        cmd.insert(4, "--no-build-isolation")
    subprocess.run(cmd, check=True, capture_output=True, timeout=500)
    wheels = list(out.glob("pandastack-*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_an_installed_wheel_builds_the_same_agent(tmp_path: Path, binary_agent: str) -> None:
    whl = build_wheel(tree_copy(tmp_path / "tree"), tmp_path / "dist")
    names = set(zipfile.ZipFile(whl).namelist())
    data = f"pandastack-{__version__}.data/data/{SHARE}"
    sources = sorted(p.name for p in (REPO / "guest-agent" / "src").glob("*.rs"))
    assert sources and {f"{data}/guest-agent/src/{n}" for n in sources} <= names
    assert f"{data}/scripts/build-guest-agent.sh" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                    "--no-deps", "--no-index", str(whl)], check=True, capture_output=True,
                   timeout=300)
    site = next((venv / "lib").glob("python3*/site-packages"))
    # The server's dependencies from this venv, after the installed pandastack on the path.
    (site / "zz-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = (
        "import hashlib, sys\n"
        "from pandastack.host.images import build\n"
        "print(build.__file__)\n"
        "print(hashlib.sha256(build.guest_agent_binary()).hexdigest())\n"
    )
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PANDASTACK_GUEST_AGENT", None)  # the default: the binary
    env["PANDASTACK_AGENT_CACHE"] = str(tmp_path / "cache")  # empty: a real build
    out = subprocess.run([str(py), "-c", probe], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]
    module, digest = out.stdout.split()
    assert Path(module).is_relative_to(site)  # the installed copy, not this checkout
    assert (venv / SHARE / "guest-agent" / "src" / "main.rs").is_file()
    # Same sources, flags and compiler: the same bytes as the checkout's build.
    assert digest == hashlib.sha256(Path(binary_agent).read_bytes()).hexdigest()
    assert len(list((tmp_path / "cache").iterdir())) == 1
