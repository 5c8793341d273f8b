"""`pandastack files watch` through `pandastack.cli.main` against a real uvicorn server over
the in-memory host, whose scripted watch gives a create and a rename and then ends (or
overflows for a path ending in "flood"): the plain and JSON lines, --count, exit 3 after an
overflow, and a missing directory as an API error."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_file_commands(server: FakeServer, capsys: pytest.CaptureFixture[str],
                       tmp_path: Path) -> None:
    assert main(["sandbox", "create"]) == 0
    sid = capsys.readouterr().out.strip()
    local = tmp_path / "data.bin"
    local.write_bytes(bytes(range(256)) * 1000)
    try:
        assert main(["files", "mkdir", sid, "/work/d", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"made": "/work/d"}
        assert main(["files", "put", sid, str(local), "/work/d/data.bin", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"path": "/work/d/data.bin",
                                                       "size": 256_000}
        assert main(["files", "ls", sid, "/work/d", "--json"]) == 0
        [entry] = json.loads(capsys.readouterr().out)["entries"]
        assert (entry["name"], entry["size"]) == ("data.bin", 256_000)
        assert main(["files", "stat", sid, "/work/d/data.bin"]) == 0
        assert capsys.readouterr().out.startswith("/work/d/data.bin\tfile\t256000\t")
        (tmp_path / "note.txt").write_text("a note\n")
        assert main(["files", "put", sid, str(tmp_path / "note.txt"), "/work/d/note"]) == 0
        assert capsys.readouterr().out == ""  # nothing but the result, and there is none
        assert main(["files", "cat", sid, "/work/d/note"]) == 0
        assert capsys.readouterr().out == "a note\n"
        back = tmp_path / "back.bin"
        assert main(["files", "get", sid, "/work/d/data.bin", str(back), "--quiet"]) == 0
        assert back.read_bytes() == local.read_bytes()
        assert main(["files", "mv", sid, "/work/d/data.bin", "/work/d/moved.bin"]) == 0
        # (The fake host keeps files, not directories: a directory's rm -r is on a real VM,
        # tests/e2e/test_cli_state.py.)
        assert main(["files", "rm", sid, "/work/d/moved.bin", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"removed": "/work/d/moved.bin"}
        assert main(["files", "stat", sid, "/work/d/moved.bin", "--json"]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["status"] == 404
    finally:
        assert main(["sandbox", "kill", sid]) == 0


def test_files_grep_and_glob(server: FakeServer, capsys: pytest.CaptureFixture[str],
                             tmp_path: Path) -> None:
    assert main(["sandbox", "create"]) == 0
    sid = capsys.readouterr().out.strip()
    (tmp_path / "a.py").write_text("x = 1\nX = 2\n")
    try:
        assert main(["files", "put", sid, str(tmp_path / "a.py"), "/work/a.py"]) == 0
        assert main(["files", "grep", sid, "/work", "x =", "-i"]) == 0
        assert capsys.readouterr().out.splitlines() == ["/work/a.py:1:x = 1", "/work/a.py:2:X = 2"]
        assert main(["files", "grep", sid, "/work", "X", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {
            "matches": [{"path": "/work/a.py", "line": 2, "text": "X = 2"}], "truncated": False}
        assert main(["files", "glob", sid, "/work", "*.py"]) == 0
        assert capsys.readouterr().out == "/work/a.py\n"
        assert main(["files", "glob", sid, "/work", "../*", "--json"]) == 1  # refused locally
        assert "must not contain '..'" in capsys.readouterr().err
        assert main(["files", "grep", sid, "/missing", "x", "--json"]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["status"] == 404
    finally:
        assert main(["sandbox", "kill", sid]) == 0
