"""`pandastack hosts list|drain|undrain`: parsing, the table's cells, and each command (plain
and `--json`) through `pandastack.cli.main` against a real uvicorn server over a cluster
without VMs (tests/server/fake_cluster.py) and over one in-memory host (serve_fake.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.cli import hosts as cli
from pandastack.cli.main import main
from pandastack.hostport.compat import HOST_PROTOCOL, OLDEST_HOST_PROTOCOL, Levels
from pandastack.sdk import Client, HostInfo
from pandastack.server.store import open_store
from tests.server.fake_cluster import CAPACITY, ENDPOINTS, STALE_AFTER_S, age
from tests.server.live import FakeServer, fake_server


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pandastack")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.add_parser(sub)
    return parser.parse_args(["hosts", *argv])


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    with fake_server(tmp_path, module="tests.server.fake_cluster") as srv:
        monkeypatch.setenv("PANDASTACK_API", srv.url)
        monkeypatch.setenv("PANDASTACK_API_KEY", srv.admin_key)
        yield srv


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main(["hosts", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_parsing() -> None:
    args = parse("list")
    assert (args.hosts_command, args.json) == ("list", False)
    args = parse("drain", "host-1", "--json")
    assert (args.hosts_command, args.host, args.json) == ("drain", "host-1", True)
    assert parse("undrain", "host-1").host == "host-1"
    with pytest.raises(SystemExit):
        parse("drain")


def test_list_rows() -> None:
    host = HostInfo(id="host-1", endpoint="http://10.0.0.1:7000", state="draining", vcpus=8,
                    memory_mb=16384, disk_mb=1, used_vcpus=2, used_memory_mb=1024,
                    sandboxes=3, epoch=2, heartbeat_age_seconds=4.2)
    assert cli.list_rows([host]) == [("host-1", "draining", "http://10.0.0.1:7000", "2/8",
                                      "1024/16384M", "3", "4s ago", "-")]


def test_list_drain_undrain(cluster: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, hosts = run_json(capsys, "list")
    assert code == 0 and isinstance(hosts, list)
    assert [(h["endpoint"], h["state"]) for h in hosts] == [(e, "live") for e in ENDPOINTS]
    a, b = (h["id"] for h in hosts)

    assert run_json(capsys, "drain", b) == (0, {"host_id": b, "moved": {}, "failed": {},
                                                "stayed_hibernated": [], "moved_live": []})
    assert main(["sandbox", "create"]) == 0  # goes to a: b is draining
    sandbox = capsys.readouterr().out.strip()
    code, undrained = run_json(capsys, "undrain", b)
    assert code == 0 and isinstance(undrained, dict)
    assert (undrained["id"], undrained["state"]) == (b, "live")

    # An in-memory host has no object store to wake from: the sandbox cannot move, stays.
    code, report = run_json(capsys, "drain", a)
    assert code == cli.EXIT_NOT_ALL_MOVED and isinstance(report, dict)
    assert (report["moved"], list(report["failed"])) == ({}, [sandbox])
    assert main(["hosts", "drain", a]) == cli.EXIT_NOT_ALL_MOVED
    captured = capsys.readouterr()
    assert captured.out == f"{a} is draining: it takes no new sandbox\n"
    assert captured.err.startswith(f"not moved {sandbox}: ")

    store = open_store(f"sqlite:///{cluster.log.parent / 'pandastack.db'}")
    try:
        age(store, b, 2 * STALE_AFTER_S)
    finally:
        store.close()
    assert main(["hosts", "list"]) == 0  # not a terminal: tab-separated lines
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(cells[0], cells[1], cells[2]) for cells in lines] == [
        (a, "draining", ENDPOINTS[0]), (b, "lost", ENDPOINTS[1])]
    assert all(len(cells) == len(cli.LIST_COLUMNS) for cells in lines)


def test_errors(cluster: FakeServer, capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["hosts", "undrain", "host-nope", "--json"]) == cli.EXIT_API_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    error = json.loads(captured.err)["error"]
    assert (error["status"], error["code"]) == (404, "not_found")
    with Client(cluster.url, cluster.admin_key) as admin:
        plain = admin.keys.create("plain", team="team-a").key
    monkeypatch.setenv("PANDASTACK_API_KEY", plain)
    assert main(["hosts", "list"]) == cli.EXIT_API_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "403 forbidden" in err, err


def test_one_host_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(tmp_path) as srv:
        monkeypatch.setenv("PANDASTACK_API", srv.url)
        monkeypatch.setenv("PANDASTACK_API_KEY", srv.admin_key)
        assert run_json(capsys, "list") == (0, [])
        assert main(["hosts", "drain", "host-0123456789ab"]) == cli.EXIT_API_ERROR
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "drives one host" in err and "409 conflict" in err


def test_list_says_why_a_host_is_incompatible(cluster: FakeServer,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(f"sqlite:///{cluster.log.parent / 'pandastack.db'}")
    try:  # the agent at ENDPOINTS[1] registers again, two host API levels behind
        b = store.register_host(ENDPOINTS[1], **CAPACITY, version="0.0.1",
                                levels=Levels.speaking(OLDEST_HOST_PROTOCOL - 1)).id
    finally:
        store.close()
    assert main(["hosts", "list"]) == 0
    captured = capsys.readouterr()
    states = [line.split("\t")[:2] for line in captured.out.splitlines()]
    assert states[1] == [b, "incompatible"] and states[0][1] == "live"
    assert captured.err == (f"{b} is incompatible: agent speaks host protocol "
                            f"{OLDEST_HOST_PROTOCOL - 1}, older than this API server serves "
                            f"({OLDEST_HOST_PROTOCOL} to {HOST_PROTOCOL}): upgrade the agent\n")
