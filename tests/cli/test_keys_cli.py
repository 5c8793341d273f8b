"""`pandastack keys` through the API (an admin key of a real uvicorn server over the in-memory
host, tests/server/serve_fake.py) and with `--db` on the server's database: the key printed
once, the JSON and plain outputs, revocation, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from pandastack.cli.main import main
from tests.server.live import FakeServer


def test_keys_through_the_api(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "create", "--name", "ci", "--team", "team-a", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert (made["name"], made["team"]) == ("ci", "team-a") and made["key"].startswith("psk_")
    # The new key works, in its team.
    r = httpx.get(f"{server.url}/v1/sandboxes",
                  headers={"Authorization": f"Bearer {made['key']}"})
    assert r.status_code == 200, r.text

    assert main(["keys", "create", "--name", "plain"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().startswith("psk_") and "shown only this once" in err
    assert main(["keys", "list", "--json"]) == 0
    listed = {k["id"]: k for k in json.loads(capsys.readouterr().out)["keys"]}
    assert made["id"] in listed and not listed[made["id"]]["revoked"]
    assert all("key" not in k for k in listed.values())  # secrets are never listed

    assert main(["keys", "revoke", made["id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"revoked": made["id"]}
    r = httpx.get(f"{server.url}/v1/sandboxes",
                  headers={"Authorization": f"Bearer {made['key']}"})
    assert r.status_code == 401
    assert main(["keys", "list"]) == 0  # not a terminal: tab-separated lines
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(made["id"]))
    assert line.split("\t")[-1] == "yes"

    # The API makes team keys only; a team key may not manage keys.
    assert main(["keys", "create", "--name", "boss", "--admin"]) == 1
    assert "--db" in capsys.readouterr().err
    assert main(["keys", "create", "--name", "t", "--team", "team-b", "--json"]) == 0
    team_key = json.loads(capsys.readouterr().out)["key"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PANDASTACK_API_KEY", team_key)
        assert main(["keys", "list", "--json"]) == 1
        assert json.loads(capsys.readouterr().err)["error"]["code"] == "forbidden"


def test_keys_in_the_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PANDASTACK_DB", f"sqlite:///{tmp_path / 'db' / 'pandastack.db'}")
    assert main(["keys", "create", "--name", "root", "--admin", "--db", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["team"] == "default"
    assert main(["keys", "list", "--db", "--json"]) == 0
    assert [k["id"] for k in json.loads(capsys.readouterr().out)["keys"]] == [made["id"]]
    assert main(["keys", "revoke", made["id"], "--db"]) == 0
    assert main(["keys", "revoke", "key-nope", "--db"]) == 1
    assert "no key" in capsys.readouterr().err
