"""`pandastack usage` and `pandastack teams set-quota|get-quota` through `pandastack.cli.main`
against a real uvicorn server over the in-memory host (tests/server/serve_fake.py): parsing,
the JSON and plain outputs, and a 429 quota_exceeded reported as an API error."""

from __future__ import annotations

import json

import pytest

from pandastack.cli.main import main
from pandastack.sdk import Client, QuotaExceededError
from tests.server.live import FakeServer


def test_quota_and_usage_commands(server: FakeServer,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with Client(server.url, server.admin_key) as admin:
        team_key = admin.keys.create("k", team="acme").key
    code = main(["teams", "set-quota", "acme", "--max-sandboxes", "1", "--max-vcpus", "16",
                 "--max-memory-mb", "32768", "--max-volume-gb", "100",
                 "--monthly-budget-usd", "50", "--max-hibernated", "3",
                 "--max-snapshot-gb", "7.5", "--max-template-gb", "2.5", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    info = json.loads(out)
    assert (info["max_sandboxes"], info["max_vcpus"], info["max_memory_mb"],
            info["max_volume_gb"], info["monthly_budget_usd"], info["max_hibernated"],
            info["max_snapshot_gb"], info["max_template_gb"]) == (1, 16, 32768, 100, 50, 3, 7.5,
                                                                  2.5)
    assert info["defaults"] == []
    assert (info["usage"]["hibernated"], info["usage"]["snapshot_gb"],
            info["usage"]["template_gb"]) == (0, 0, 0)
    assert main(["teams", "set-quota", "acme", "--clear", "max-vcpus"]) == 0
    out = capsys.readouterr().out  # not a terminal: tab-separated lines
    assert "max_vcpus\tunlimited\t0\tserver default" in out.splitlines()
    assert "max_sandboxes\t1\t0\tteam" in out.splitlines()
    assert "max_hibernated\t3\t0\tteam" in out.splitlines()
    assert "max_template_gb\t2.5\t0\tteam" in out.splitlines()
    with Client(server.url, team_key) as team:
        sbx = team.sandboxes.create(vcpus=2, memory_mb=1024)
        with pytest.raises(QuotaExceededError) as exc:
            team.sandboxes.create()
        assert (exc.value.limit, exc.value.value, exc.value.current) == ("max_sandboxes", 1, 1)
        assert main(["teams", "get-quota", "acme", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["usage"]["sandboxes"] == 1
        assert main(["usage", "--team", "acme", "--group-by", "template", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["team"] == "acme" and report["rows"][0]["template"] == "base"
        assert report["rows"][0]["vcpu_seconds"] > 0
        assert main(["usage", "--team", "acme", "--start", "2026-01-01T00:00:00Z"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split("\t")[:2] == ["acme", sbx.id] and lines[-1].startswith("total")
        sbx.kill()
    assert main(["usage", "--start", "tomorrow", "--json"]) == 1
    err = json.loads(capsys.readouterr().err)["error"]
    assert err["code"] == "validation_error" and err["status"] == 422
    with pytest.raises(SystemExit):
        main(["teams", "set-quota", "acme", "--max-sandboxes", "many"])
    with pytest.raises(SystemExit):
        main(["usage", "--group-by", "week"])
