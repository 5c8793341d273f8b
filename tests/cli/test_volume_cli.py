"""`pandastack volume ...` and `pandastack sandbox create --volume` through
`pandastack.cli.main` against a real uvicorn server over the in-memory host
(tests/server/serve_fake.py): the JSON and plain outputs, and 409 volume_in_use reported as an
API error."""

from __future__ import annotations

import argparse
import json

import pytest

from pandastack.cli.main import main
from pandastack.cli.sandbox import parse_volume
from tests.server.live import FakeServer


def test_volume_commands(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["volume", "create", "data", "--size-mb", "64", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert (made["name"], made["size_mb"], made["attachments"]) == ("data", 64, [])
    assert main(["volume", "create", "ref"]) == 0
    capsys.readouterr()
    assert main(["sandbox", "create", "--volume", "data:/data", "--volume", "ref:/ref:ro",
                 "--json"]) == 0
    sbx = json.loads(capsys.readouterr().out)
    assert [(v["name"], v["mount_path"], v["read_only"]) for v in sbx["volumes"]] == [
        ("data", "/data", False), ("ref", "/ref", True)]

    assert main(["volume", "list"]) == 0  # not a terminal: tab-separated lines
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"data\t{made['id']}\t64\t{sbx['id']}:/data",
                     f"ref\t{lines[1].split(chr(9))[1]}\t1024\t{sbx['id']}:/ref:ro"]
    assert main(["volume", "get", "data", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attachments"][0]["sandbox_id"] == sbx["id"]
    for argv in (["volume", "delete", "data", "--json"],
                 ["volume", "resize", "data", "--size-mb", "128", "--json"]):
        assert main(argv) == 1
        err = json.loads(capsys.readouterr().err)["error"]
        assert (err["code"], err["status"]) == ("volume_in_use", 409)
    assert main(["sandbox", "create", "--volume", "data:/data"]) == 1
    assert "volume_in_use" in capsys.readouterr().err

    assert main(["sandbox", "kill", sbx["id"]]) == 0
    capsys.readouterr()
    assert main(["volume", "resize", "data", "--size-mb", "128", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["size_mb"] == 128
    assert main(["volume", "delete", "data", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": "data"}
    assert main(["volume", "get", "data", "--json"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"
    # This server's host has no object store: snapshots and moves say so (exit 1).
    assert main(["volume", "snapshot", "ref", "--json"]) == 1
    assert "PANDASTACK_OBJECT_STORE" in json.loads(capsys.readouterr().err)["error"]["message"]
    assert main(["volume", "snapshots", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"snapshots": []}
    assert main(["volume", "move", "ref", "h-1", "--json"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "validation_error"
    assert main(["volume", "create", "x", "--from-snapshot", "vsnap-000000000000"]) == 1
    assert "not_found" in capsys.readouterr().err
    assert main(["volume", "delete", "ref"]) == 0
    assert main(["volume", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"volumes": []}
    with pytest.raises(SystemExit):
        main(["volume", "resize", "data"])  # --size-mb is required


def test_volume_argument() -> None:
    assert parse_volume("data:/mnt/d:ro") == {"name": "data", "mount_path": "/mnt/d",
                                              "read_only": True}
    assert parse_volume("data:/a:b") == {"name": "data", "mount_path": "/a:b",
                                         "read_only": False}
    for bad in ("data", "data:rel", ":/x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_volume(bad)
