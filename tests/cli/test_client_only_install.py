"""`pip install pandastack` without the server extra: the SDK and the client commands work.

A child interpreter hides the server extra's packages behind an import blocker (as if they
were not installed), then imports the SDK, talks to a fake transport, runs `python -m
pandastack` and the client commands, and reports what it loaded. It needs no network."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# Top-level modules of the server extra (and of what only those pull in).
SERVER_ONLY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "qemu")
# Loaded when present, not needed: httpx imports its CLI's click in a try block,
# setuptools' .pth file loads _distutils_hack at start-up, and httpcore imports h2 (with
# hpack and hyperframe) in a try block when it is installed (the dev extra's e2b needs it),
# and httpx's decoders import zstandard in a try block (the server extra's, for image layers).
INCIDENTAL = {"click", "setuptools", "h2", "hpack", "hyperframe", "zstandard"}

CHILD = r"""
import contextlib, io, json, os, runpy, sys, importlib.abc

BLOCKED = set(sys.argv[1].split(","))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
report = {}

import httpx
import pandastack
from pandastack import AsyncClient, AsyncSandbox, Client, Sandbox

def handle(request):
    return httpx.Response(200, json={"sandboxes": []})

transport = httpx.MockTransport(handle)
report["list"] = Sandbox.list(api_url="http://pandastack.test", api_key="k",
                              transport=transport)
with Client("http://pandastack.test", "k", transport=transport) as client:
    report["client_list"] = client.sandboxes.list()
AsyncClient("http://pandastack.test", "k")
assert AsyncSandbox.list

def run(module_argv):
    # `python -m pandastack ARGS`, in this (blocked) interpreter
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["pandastack", *module_argv]
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("pandastack", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}

report["help"] = run(["--help"])
report["sandbox_help"] = run(["sandbox", "--help"])
# nothing listens on the discard port of loopback: a clear "cannot reach" error, exit 1
os.environ["PANDASTACK_API"] = "http://127.0.0.1:9"
os.environ["PANDASTACK_API_KEY"] = "psk_x"
report["sandbox_list"] = run(["sandbox", "list"])
report["volume_list"] = run(["volume", "list"])
report["usage"] = run(["usage"])
report["client_modules"] = sorted(m for m in sys.modules
                                  if m.partition(".")[0] not in sys.stdlib_module_names)
report["serve"] = run(["serve"])
report["keys"] = run(["keys", "list", "--db"])
report["keys_api"] = run(["keys", "list"])
report["loaded_blocked"] = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
print(json.dumps(report))
"""


def run_blocked(tmp_path: Path) -> dict[str, Any]:
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "PANDASTACK_DB": f"sqlite:///{tmp_path / 'db' / 'pandastack.db'}"}
    done = subprocess.run([sys.executable, "-c", CHILD, ",".join(SERVER_ONLY)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_sdk_and_client_commands_work_without_the_server_extra(tmp_path: Path) -> None:
    report = run_blocked(tmp_path)
    assert report["list"] == [] and report["client_list"] == []
    assert report["help"]["code"] == 0
    assert "serve" in report["help"]["out"] and "sandbox" in report["help"]["out"]
    assert report["sandbox_help"]["code"] == 0 and "list" in report["sandbox_help"]["out"]
    assert report["sandbox_list"]["code"] == 1
    assert "cannot reach the pandastack server" in report["sandbox_list"]["err"]
    for command in ("volume_list", "usage", "keys_api"):  # the SDK only, like `sandbox`
        assert report[command]["code"] == 1, report[command]
        assert "cannot reach the pandastack server" in report[command]["err"], report[command]
    client_side = {m.partition(".")[0] for m in report["client_modules"]}
    assert not client_side & set(SERVER_ONLY)
    assert "pandastack.server" not in report["client_modules"]
    assert "pandastack.host" not in report["client_modules"]
    assert report["loaded_blocked"] == []


def test_server_commands_name_the_missing_extra(tmp_path: Path) -> None:
    report = run_blocked(tmp_path)
    for command in ("serve", "keys"):
        assert report[command]["code"] == 1, report[command]
        assert "pip install 'pandastack[server]'" in report[command]["err"]
        assert "Traceback" not in report[command]["err"]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _closure(names: set[str]) -> set[str]:
    """The distributions `names` pull in (their base requirements, recursively)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(text))
    return seen


def test_base_dependencies_cover_what_the_client_side_imports(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    server = {_name(r) for r in project["optional-dependencies"]["server"]}
    assert {"fastapi", "uvicorn", "sqlalchemy", "alembic", "qemu-qmp"} <= server
    assert "websockets" in base  # the SDK's terminals (docs/adr/0028-terminals.md)
    assert not base & server
    providers = metadata.packages_distributions()
    loaded = {m.partition(".")[0] for m in run_blocked(tmp_path)["client_modules"]}
    assert {"httpx", "pydantic", "rich", "anyio"} <= loaded
    # modules no distribution provides are the interpreter's own (_sysconfigdata_*, ...)
    needed = {_name(d) for m in loaded - {"pandastack"} for d in providers.get(m, [])}
    assert needed - INCIDENTAL <= _closure(base), needed - INCIDENTAL - _closure(base)
