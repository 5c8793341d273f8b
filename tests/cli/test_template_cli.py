"""`pandastack template build|logs` against a real uvicorn server over the in-memory host
(whose builds run their steps as a script): the result alone on stdout, the log on stderr
unless --quiet, and `logs` by name, NAME:VERSION and build id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pandastack.cli.main import main
from tests.server.live import FakeServer


def test_build_quiet_and_logs(server: FakeServer, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Dockerfile").write_text("FROM base\nRUN echo one\nRUN echo two\n")
    assert main(["template", "build", str(tmp_path), "--name", "app"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("app:1 ready (build tb-") and out.count("\n") == 1
    assert "Step 1/" in err
    assert main(["template", "build", str(tmp_path), "--name", "app", "--quiet", "--json"]) == 0
    out, err = capsys.readouterr()
    made = json.loads(out)
    assert (made["version"], made["status"], err) == (2, "ready", "")
    for which in ("app", "app:2", made["build_id"]):
        assert main(["template", "logs", which]) == 0
        assert "Step 1/" in capsys.readouterr().out
    assert main(["template", "logs", "app:9"]) == 1
    assert "no version 9" in capsys.readouterr().err
    assert main(["template", "delete", "app", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": "app", "version": None}


def test_list_shows_the_builtin_templates_marked(server: FakeServer, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh install lists base, python, node, code-interpreter and full (the default marked),
    not an empty table; the team's own templates come after them."""
    assert main(["template", "list"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["base", "built-in", "(default)"], ["code-interpreter", "built-in"],
                    ["full", "built-in"], ["node", "built-in"], ["python", "built-in"]]

    (tmp_path / "Dockerfile").write_text("FROM python\nRUN echo one\n")
    assert main(["template", "build", str(tmp_path), "--name", "app", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["template", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["builtin"]) for t in listed] == [
        ("base", True), ("code-interpreter", True), ("full", True), ("node", True),
        ("python", True), ("app", False)]
    assert [t["name"] for t in listed if t["builtin"] and t["default"]] == ["base"]
    assert (listed[-1]["version"], listed[-1]["status"]) == (1, "ready")


def test_build_args_reach_the_dockerfiles_args(server: FakeServer, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Dockerfile").write_text("ARG BASE=no-such-template\nFROM $BASE\nRUN true\n")
    assert main(["template", "build", str(tmp_path), "--name", "app", "--quiet"]) == 1
    assert "no-such-template" in capsys.readouterr().err  # the default: not a template
    assert main(["template", "build", str(tmp_path), "--name", "app", "--quiet",
                 "--build-arg", "BASE=python", "--build-arg", "OTHER=x=y"]) == 0
    assert capsys.readouterr().out.startswith("app:1 ready")
    with pytest.raises(SystemExit):
        main(["template", "build", str(tmp_path), "--name", "app", "--build-arg", "BASE"])
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_info_lists_the_versions_with_their_images_ports(
        server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Dockerfile").write_text("FROM base\nRUN true\n")
    assert main(["template", "build", str(tmp_path), "--name", "app", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["template", "info", "app"]) == 0  # `show`, by its other name
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["VERSION", "STATUS", "STEPS", "CACHED", "PORTS", "BUILD", "ERROR"]
    assert row.split()[:2] == ["1", "ready"]
    assert main(["template", "show", "app", "--json"]) == 0
    # FROM a template: no image, no ports (FROM an image: tests/e2e/test_templates_oci.py).
    assert [v["exposed_ports"] for v in json.loads(capsys.readouterr().out)["versions"]] == [[]]
