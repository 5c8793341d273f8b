"""`pandastack registry login|list|logout` through `pandastack.cli.main` against a real uvicorn
server over the in-memory host: the password from stdin or the environment (never an
argument), never printed back; no password is exit 2 before any request."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.cli.main import main
from pandastack.cli.registry import PASSWORD_ENV
from pandastack.server.registries.sealing import make_key_file
from tests.server.live import FakeServer, fake_server

PASSWORD = "pa55-from-stdin"


@pytest.fixture
def keyed_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    key = tmp_path / "encryption.key"
    make_key_file(key)
    with fake_server(tmp_path, encryption_key_file=str(key)) as srv:
        monkeypatch.setenv("PANDASTACK_API", srv.url)
        monkeypatch.setenv("PANDASTACK_API_KEY", srv.admin_key)
        yield srv


def test_login_list_logout(keyed_server: FakeServer, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["registry", "login", "GHCR.io", "-u", "acme-bot", "--password-stdin"]) == 0
    assert capsys.readouterr().out == "logged in to ghcr.io as acme-bot\n"

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD + "-env")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["registry", "login", "127.0.0.1:5000", "--username", "ci", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert (made["registry"], made["username"]) == ("127.0.0.1:5000", "ci")

    assert main(["registry", "list", "--json"]) == 0
    out = capsys.readouterr().out
    assert PASSWORD not in out
    assert [(r["registry"], r["username"]) for r in json.loads(out)] == [
        ("127.0.0.1:5000", "ci"), ("ghcr.io", "acme-bot")]
    assert main(["registry", "logout", "ghcr.io"]) == 0
    assert main(["registry", "logout", "ghcr.io"]) == 1
    assert "not found" in capsys.readouterr().err.lower()
    assert main(["registry", "list"]) == 0
    assert capsys.readouterr().out.split("\t")[:2] == ["127.0.0.1:5000", "ci"]
    assert PASSWORD not in keyed_server.log.read_text()


def test_no_password_is_exit_2(keyed_server: FakeServer, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: nobody to ask
    assert main(["registry", "login", "ghcr.io", "-u", "a"]) == 2
    assert "--password-stdin" in capsys.readouterr().err
    assert main(["registry", "login", "ghcr.io", "-u", "a", "--password-stdin"]) == 2
    assert main(["registry", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_the_password_is_not_an_argument() -> None:
    with pytest.raises(SystemExit):
        main(["registry", "login", "ghcr.io", "-u", "a", "--password", PASSWORD])
