"""`pandastack sandbox ...` as a user runs it: the real CLI in a subprocess against a live
server, configured only by PANDASTACK_API / PANDASTACK_API_KEY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack import Client
from tests.e2e.conftest import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


class CLI:
    def __init__(self, server: LiveServer, home: Path) -> None:
        self.server = server
        self.env = {**os.environ, "PANDASTACK_API": server.api_url,
                    "PANDASTACK_API_KEY": server.api_key, "XDG_CONFIG_HOME": str(home)}

    def __call__(self, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pandastack.cli.main", "sandbox", *argv],
                              env=self.env, input=stdin, capture_output=True, text=True,
                              timeout=120, check=False)


@pytest.fixture
def cli(live_server: LiveServer, tmp_path: Path) -> Iterator[CLI]:
    runner = CLI(live_server, tmp_path)
    yield runner
    with Client(live_server.api_url, live_server.api_key) as client:  # whatever a test left
        for info in client.sandboxes.list(metadata={"suite": "cli-e2e"}):
            client.sandboxes.kill(info.id)


def test_create_exec_list_kill(cli: CLI) -> None:
    created = cli("create", "--ttl", "300", "--metadata", "suite=cli-e2e", "owner=test")
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.strip()
    assert sandbox_id.startswith("sbx-") and created.stdout == sandbox_id + "\n"

    run = cli("exec", sandbox_id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (run.returncode, run.stdout, run.stderr) == (3, "out\n", "err\n")

    run = cli("exec", sandbox_id, "python3 -c 'print(6*7)' | tr 4 X")  # one word: a shell line
    assert (run.returncode, run.stdout) == (0, "X2\n"), run.stderr

    run = cli("exec", "--json", "-i", sandbox_id, "--", "wc", "-c", stdin="12345")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["stdout"].strip() == "5"

    run = cli("shell", sandbox_id, stdin="mkdir -p /work/d && cd /work/d\npwd\nfalse\nexit\n")
    assert run.returncode == 1, run.stderr  # `exit` leaves with the last status
    assert run.stdout == "/work/d\n"

    listed = cli("list", "--json", "--metadata", "suite=cli-e2e")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert (entry["id"], entry["state"]) == (sandbox_id, "running")
    assert entry["metadata"] == {"suite": "cli-e2e", "owner": "test"}

    plain = cli("list", "--state", "running")
    assert any(line.split("\t")[:2] == [sandbox_id, "running"]
               for line in plain.stdout.splitlines())

    killed = cli("kill", sandbox_id)
    assert (killed.returncode, killed.stdout) == (0, f"killed {sandbox_id}\n"), killed.stderr
    assert json.loads(cli("list", "--json", "--metadata", "suite=cli-e2e").stdout) == []
    [entry] = json.loads(cli("list", "--all", "--json", "--metadata", "suite=cli-e2e").stdout)
    assert entry["state"] == "killed"

    after = cli("exec", sandbox_id, "--", "true")
    assert after.returncode == 125
    assert after.stdout == "" and after.stderr.startswith("error: ")
    assert after.stderr.count("\n") == 1 and "409 conflict" in after.stderr


def test_errors_are_one_line(cli: CLI) -> None:
    missing = cli("exec", "sbx-000000000000", "--", "true")
    assert missing.returncode == 125
    assert missing.stderr.startswith("error: ") and "404 not_found, request req_" in missing.stderr
    assert missing.stderr.count("\n") == 1

    bad_key = CLI(cli.server, Path(cli.env["XDG_CONFIG_HOME"]))
    bad_key.env["PANDASTACK_API_KEY"] = "psk_not_a_real_key"
    denied = bad_key("list", "--json")
    assert denied.returncode == 1 and denied.stdout == ""
    assert json.loads(denied.stderr)["error"]["status"] == 401
