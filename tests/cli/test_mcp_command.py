"""`pandastack mcp` where it cannot serve: without the `mcp` package it names the extra to
install; without a configured server it says what to configure. Exit 1, no traceback, and
nothing on stdout (an agent runtime would read it as protocol)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCK_MCP = r"""
import importlib.abc, runpy, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "mcp":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["pandastack", "mcp"]
runpy.run_module("pandastack", run_name="__main__", alter_sys=True)
"""


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)


def test_without_the_mcp_package_it_names_the_extra(tmp_path: Path) -> None:
    done = _run(tmp_path, "-c", BLOCK_MCP)
    assert done.returncode == 1, done.stderr
    assert "pip install 'pandastack[mcp]'" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_without_a_configured_server_it_says_what_to_set(tmp_path: Path) -> None:
    done = _run(tmp_path, "-m", "pandastack", "mcp")
    assert done.returncode == 1, done.stderr
    assert "PANDASTACK_API" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
