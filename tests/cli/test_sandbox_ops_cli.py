"""The sandbox state commands, `pandastack snapshot` and `pandastack template logs` against a
real uvicorn server over the in-memory host (the real-VM run is tests/e2e/test_cli_state.py);
the parsing of /proc/net/tcp for `ports`."""

from __future__ import annotations

import json

import pytest

from pandastack.cli.main import main
from pandastack.cli.sandbox_ops import listening_ports
from tests.server.live import FakeServer

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1
   1: 0100007F:0277 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2
   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3
  sl  local_address                         remote_address                        st tx_queue
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0:0 0
garbage line
"""


def test_listening_ports_are_the_listen_sockets_once_each() -> None:
    # 0x1F90 = 8080 on IPv4 and IPv6 (once), 0x0277 = 631; 0xC350 is an established one.
    assert listening_ports(PROC_NET_TCP) == [631, 8080]
    assert listening_ports("") == []


def test_state_commands_and_snapshots(server: FakeServer,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "create"]) == 0
    sid = capsys.readouterr().out.strip()
    assert main(["sandbox", "info", sid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == sid
    for verb, state in (("pause", "paused"), ("resume", "running"),
                        ("hibernate", "hibernated"), ("wake", "running")):
        assert main(["sandbox", verb, sid]) == 0
        assert capsys.readouterr().out == f"{sid} {state}\n"
    assert main(["sandbox", "fork", sid, "--count", "2", "--json"]) == 0
    children = [c["id"] for c in json.loads(capsys.readouterr().out)["sandboxes"]]
    assert len(children) == 2
    assert main(["sandbox", "snapshot", sid, "--name", "s1"]) == 0
    snap = capsys.readouterr().out.strip()
    assert main(["snapshot", "list", "--json"]) == 0
    assert [s["id"] for s in json.loads(capsys.readouterr().out)["snapshots"]] == [snap]
    assert main(["snapshot", "delete", snap, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": [snap]}
    assert main(["snapshot", "get", snap]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["sandbox", "url", sid, "8080"]) == 0
    assert capsys.readouterr().out == f"{server.url}/v1/sandboxes/{sid}/ports/8080/\n"
    assert main(["sandbox", "ttl", sid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "running"
    with pytest.raises(SystemExit):
        main(["sandbox", "url", sid, "70000"])
    assert main(["sandbox", "kill", sid, *children]) == 0
