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
