"""`pandastack files watch` through `pandastack.cli.main` against a real uvicorn server over
the in-memory host, whose scripted watch gives a create and a rename and then ends (or
overflows for a path ending in "flood"): the plain and JSON lines, --count, exit 3 after an
overflow, and a missing directory as an API error."""

from __future__ import annotations

import json

import pytest

from pandastack.cli.main import main
from tests.server.live import FakeServer


def test_files_watch(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "create", "--json"]) == 0
    sid = json.loads(capsys.readouterr().out)["id"]
    try:
        assert main(["files", "watch", sid, "/work"]) == 0
        assert capsys.readouterr().out.splitlines() == ["create /work/a",
                                                        "rename /work/a -> /work/b"]
        assert main(["files", "watch", sid, "/work", "--json", "--count", "1"]) == 0
        assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [
            {"type": "create", "path": "/work/a", "is_dir": False}]
        assert main(["files", "watch", sid, "/work/flood", "--no-recursive"]) == 3
        assert capsys.readouterr().out.splitlines()[-1] == "overflow /work/flood"
        assert main(["files", "watch", sid, "/missing", "--json"]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["status"] == 404
    finally:
        assert main(["sandbox", "kill", sid]) == 0
