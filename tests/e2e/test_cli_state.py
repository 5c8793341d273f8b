"""The `pandastack sandbox` commands about one sandbox's state and reach, and `pandastack
snapshot`, as a user runs them: the real CLI in a subprocess against the live server, one
real sandbox through info, ttl, pause/resume, ports and url (a web server in the guest reached
through the signed URL), snapshot, fork, hibernate/wake, `pandastack files` (a 20 MB file up
and down) and logs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pandastack import Client
from tests.e2e.conftest import LiveServer
from tests.e2e.forked_cli import ForkedCLI
from tests.e2e.test_cli import CLI

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


@pytest.fixture
def cli(live_server: LiveServer, tmp_path: Path) -> Iterator[CLI]:
    runner = CLI(live_server, tmp_path)
    yield runner
    with Client(live_server.api_url, live_server.api_key) as client:
        for info in client.sandboxes.list(metadata={"suite": "cli-state"}):
            client.sandboxes.kill(info.id)


@pytest.fixture
def forked(cli: CLI) -> Iterator[ForkedCLI]:
    with ForkedCLI(cli.env) as runner:
        yield runner


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_one_sandbox_through_its_states(cli: CLI, forked: ForkedCLI,
                                        tmp_path: Path) -> None:
    # The first call starts an interpreter as a user's shell does; the others are processes
    # forked from one that imported the CLI (forked_cli.py): ~0.05 s a call instead of ~0.7.
    sid = ok(cli("create", "--ttl", "300", "--metadata", "suite=cli-state")).strip()

    def sandbox(*argv: str) -> subprocess.CompletedProcess[str]:
        return forked("sandbox", *argv)

    info = json.loads(ok(sandbox("info", sid, "--json")))
    assert (info["id"], info["state"], info["metadata"]) == (sid, "running",
                                                             {"suite": "cli-state"})
    assert "state       running" in ok(sandbox("info", sid))

    before = time.time()
    life = json.loads(ok(sandbox("ttl", sid, "900", "--json")))
    assert before + 890 <= life["expires_at"] <= time.time() + 910

    assert ok(sandbox("pause", sid)) == f"{sid} paused\n"
    assert ok(sandbox("resume", sid)) == f"{sid} running\n"

    # A web server in the guest: listed by `ports`, reached through a signed URL.
    ok(sandbox("exec", sid, "--", "sh", "-c", "cd /tmp && echo hello > index.html && "
               "(python3 -m http.server 8123 >/dev/null 2>&1 &) && sleep 0.1"))
    for _ in range(50):
        ports = json.loads(ok(sandbox("ports", sid, "--json")))["ports"]
        if any(p["port"] == 8123 for p in ports):
            break
        time.sleep(0.2)
    assert {"port": 8123, "url": f"{cli.server.api_url}/v1/sandboxes/{sid}/ports/8123/"} \
        in ports
    assert f"8123\t{cli.server.api_url}/v1/sandboxes/{sid}/ports/8123/\n" in \
        ok(sandbox("ports", sid))
    signed = ok(sandbox("url", sid, "8123", "--signed", "--ttl", "60")).strip()
    address, host = cli.server.preview(signed)
    base, _, query = address.partition("?")
    page = httpx.get(f"{base}index.html?{query}", headers=host, timeout=30)  # no API key
    assert (page.status_code, page.text) == (200, "hello\n")

    snap = ok(sandbox("snapshot", sid, "--name", "cli")).strip()
    assert snap.startswith("snap-")
    listed = json.loads(ok(forked("snapshot", "list", "--json")))["snapshots"]
    assert [s["name"] for s in listed if s["id"] == snap] == ["cli"]

    children = ok(sandbox("fork", sid, "--count", "2")).split()
    assert len(children) == 2 and all(c.startswith("sbx-") for c in children)
    ok(sandbox("kill", *children))

    assert ok(sandbox("hibernate", sid)) == f"{sid} hibernated\n"
    assert ok(sandbox("wake", sid)) == f"{sid} running\n"
    # Files: a 20 MB file up and down (streamed), listed, read, moved, removed with its dir.
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(20 << 20))
    files = ("files",)
    ok(forked(*files, "mkdir", sid, "/work/up"))
    ok(forked(*files, "put", sid, str(blob), "/work/up/blob.bin"))
    [entry] = json.loads(ok(forked(*files, "ls", sid, "/work/up", "--json")))["entries"]
    assert (entry["name"], entry["size"]) == ("blob.bin", 20 << 20)
    ok(forked(*files, "get", sid, "/work/up/blob.bin", str(tmp_path / "back.bin")))
    assert (tmp_path / "back.bin").read_bytes() == blob.read_bytes()
    ok(sandbox("exec", sid, "--", "sh", "-c", "echo text > /work/up/t"))
    assert ok(forked(*files, "cat", sid, "/work/up/t")) == "text\n"
    ok(forked(*files, "rm", sid, "/work/up", "-r"))
    assert forked(*files, "ls", sid, "/work/up").returncode == 1

    ok(sandbox("exec", sid, "--", "sh", "-c", "echo cli-state-marker > /dev/console"))
    logs = json.loads(ok(sandbox("logs", sid, "--json")))
    assert "cli-state-marker" in logs["console"] and isinstance(logs["agent"], str)
    assert "== console\n" in ok(sandbox("logs", sid))

    ok(forked("snapshot", "delete", snap))
    gone = forked("snapshot", "get", snap, "--json")
    assert gone.returncode == 1
    assert json.loads(gone.stderr)["error"]["code"] == "not_found"
    ok(sandbox("kill", sid))
