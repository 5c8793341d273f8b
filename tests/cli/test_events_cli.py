"""`pandastack events` and `pandastack webhook ...` through `pandastack.cli.main` against a
real uvicorn server over the in-memory host (tests/server/serve_fake.py, which does not let
webhooks reach loopback): the log read back from id 0, a refused loopback webhook, the list."""

from __future__ import annotations

import json

import pytest

from pandastack.cli.main import main
from tests.server.live import FakeServer


def test_events_and_webhooks(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "create", "--json"]) == 0
    sid = json.loads(capsys.readouterr().out)["id"]
    assert main(["sandbox", "kill", sid]) == 0
    capsys.readouterr()
    assert main(["events", "--after", "0", "--count", "2", "--types", "sandbox.*",
                 "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["type"], e["sandbox_id"]) for e in lines] == [("sandbox.created", sid),
                                                            ("sandbox.killed", sid)]
    assert main(["events", "--after", "0", "--count", "1"]) == 0
    assert capsys.readouterr().out.split("\t")[1:3] == ["sandbox.created", sid]

    assert main(["webhook", "create", "http://127.0.0.1:9/hook", "--events", "*",
                 "--json"]) == 1
    err = json.loads(capsys.readouterr().err)["error"]
    assert err["status"] == 422 and "url refused: 127.0.0.1" in err["message"]
    assert main(["webhook", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["webhook", "deliveries", "wh_0000000000000000"]) == 1
    assert "not found" in capsys.readouterr().err.lower()
