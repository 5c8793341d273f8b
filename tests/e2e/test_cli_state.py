"""The `pandastack sandbox` commands about one sandbox's state and reach, and `pandastack
snapshot`, as a user runs them: the real CLI in a subprocess against the live server, one
real sandbox through info, ttl, pause/resume, ports and url (a web server in the guest reached
through the signed URL), snapshot, fork, hibernate/wake, `pandastack files` (a 20 MB file up
and down) and logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pandastack import Client
from tests.e2e.conftest import LiveServer
from tests.e2e.test_cli import CLI

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


@pytest.fixture
def cli(live_server: LiveServer, tmp_path: Path) -> Iterator[CLI]:
    runner = CLI(live_server, tmp_path)
    yield runner
    with Client(live_server.api_url, live_server.api_key) as client:
        for info in client.sandboxes.list(metadata={"suite": "cli-state"}):
            client.sandboxes.kill(info.id)


def top(cli: CLI, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pandastack.cli.main", *argv], env=cli.env,
                          capture_output=True, text=True, timeout=120, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_one_sandbox_through_its_states(cli: CLI, tmp_path: Path) -> None:
    sid = ok(cli("create", "--ttl", "300", "--metadata", "suite=cli-state")).strip()
    info = json.loads(ok(cli("info", sid, "--json")))
    assert (info["id"], info["state"], info["metadata"]) == (sid, "running",
                                                             {"suite": "cli-state"})
    assert "state       running" in ok(cli("info", sid))

    before = time.time()
    life = json.loads(ok(cli("ttl", sid, "900", "--json")))
    assert before + 890 <= life["expires_at"] <= time.time() + 910

    assert ok(cli("pause", sid)) == f"{sid} paused\n"
    assert ok(cli("resume", sid)) == f"{sid} running\n"

    # A web server in the guest: listed by `ports`, reached through a signed URL.
    ok(cli("exec", sid, "--", "sh", "-c", "cd /tmp && echo hello > index.html && "
           "(python3 -m http.server 8123 >/dev/null 2>&1 &) && sleep 0.1"))
    for _ in range(50):
        ports = json.loads(ok(cli("ports", sid, "--json")))["ports"]
        if any(p["port"] == 8123 for p in ports):
            break
        time.sleep(0.2)
    assert {"port": 8123, "url": f"{cli.server.api_url}/v1/sandboxes/{sid}/ports/8123/"} \
        in ports
    assert f"8123\t{cli.server.api_url}/v1/sandboxes/{sid}/ports/8123/\n" in \
        ok(cli("ports", sid))
    signed = ok(cli("url", sid, "8123", "--signed", "--ttl", "60")).strip()
    address, host = cli.server.preview(signed)
    base, _, query = address.partition("?")
    page = httpx.get(f"{base}index.html?{query}", headers=host, timeout=30)  # no API key
    assert (page.status_code, page.text) == (200, "hello\n")

    snap = ok(cli("snapshot", sid, "--name", "cli")).strip()
    assert snap.startswith("snap-")
    listed = json.loads(ok(top(cli, "snapshot", "list", "--json")))["snapshots"]
    assert [s["name"] for s in listed if s["id"] == snap] == ["cli"]

    children = ok(cli("fork", sid, "--count", "2")).split()
    assert len(children) == 2 and all(c.startswith("sbx-") for c in children)
    ok(cli("kill", *children))

    assert ok(cli("hibernate", sid)) == f"{sid} hibernated\n"
    assert ok(cli("wake", sid)) == f"{sid} running\n"
    # Files: a 20 MB file up and down (streamed), listed, read, moved, removed with its dir.
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(20 << 20))
    files = ("files",)
    ok(top(cli, *files, "mkdir", sid, "/work/up"))
    ok(top(cli, *files, "put", sid, str(blob), "/work/up/blob.bin"))
    [entry] = json.loads(ok(top(cli, *files, "ls", sid, "/work/up", "--json")))["entries"]
    assert (entry["name"], entry["size"]) == ("blob.bin", 20 << 20)
    ok(top(cli, *files, "get", sid, "/work/up/blob.bin", str(tmp_path / "back.bin")))
    assert (tmp_path / "back.bin").read_bytes() == blob.read_bytes()
    ok(cli("exec", sid, "--", "sh", "-c", "echo text > /work/up/t"))
    assert ok(top(cli, *files, "cat", sid, "/work/up/t")) == "text\n"
    ok(top(cli, *files, "rm", sid, "/work/up", "-r"))
    assert top(cli, *files, "ls", sid, "/work/up").returncode == 1

    ok(cli("exec", sid, "--", "sh", "-c", "echo cli-state-marker > /dev/console"))
    logs = json.loads(ok(cli("logs", sid, "--json")))
    assert "cli-state-marker" in logs["console"] and isinstance(logs["agent"], str)
    assert "== console\n" in ok(cli("logs", sid))

    ok(top(cli, "snapshot", "delete", snap))
    gone = top(cli, "snapshot", "get", snap, "--json")
    assert gone.returncode == 1
    assert json.loads(gone.stderr)["error"]["code"] == "not_found"
    ok(cli("kill", sid))
