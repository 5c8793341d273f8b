"""The TypeScript SDK (sdk-ts/) against a live server booting real VMs: its integration tests
(`node --test` on the compiled sdk-ts/test/integration/live.test.ts: the seed's agent loop,
streaming exec, a background process, files, a 50 MB file streamed both ways in bounded
memory, a terminal, a file watch, run_code with a PNG, a fork with three children, a
template built from Dockerfile text that COPYs a directory of its context, with its log,
and a sandbox of it reading the copied files), and the packed
tarball installed into an empty folder running the README's TypeScript quickstart.

The SDK is built here (sdk-ts/scripts/build.sh: `npm ci` from the committed lock, reused
while the lock is unchanged, then `tsc`), so a targeted run needs no other step.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack import Client
from pandastack.wire.sandboxes import ENDED_STATES
from tests.e2e.conftest import LiveServer
from tests.leftovers import owned_tmpdir

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk-ts"


@pytest.fixture(scope="module")
def built() -> Path:
    """The compiled SDK (sdk-ts/dist)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (scripts/host-deps.sh installs them)")
    subprocess.run(["bash", str(SDK / "scripts" / "build.sh")], check=True, timeout=600)
    return SDK / "dist"


@pytest.fixture
def node_env(live_server: LiveServer) -> Iterator[dict[str, str]]:
    """The environment a user's node process has: the server and key, nothing else; a
    config dir of its own so no ~/.config file is read."""
    home = owned_tmpdir("psts-")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home),
           "PANDASTACK_API": live_server.api_url, "PANDASTACK_API_KEY": live_server.api_key}
    try:
        yield env
    finally:
        shutil.rmtree(home, ignore_errors=True)


def live_sandboxes(server: LiveServer, label: str | None = None) -> list[str]:
    with Client(api_url=server.api_url, api_key=server.api_key) as client:
        listed = client.sandboxes.list(metadata={"test": label} if label else None)
        return sorted(s.id for s in listed if s.info.state not in ENDED_STATES)


@pytest.mark.timeout(1200)
def test_integration_suite(built: Path, node_env: dict[str, str],
                           live_server: LiveServer) -> None:
    suite = built / "test" / "integration" / "live.test.js"
    source = (SDK / "test" / "integration" / "live.test.ts").read_text()
    count = len(re.findall(r"^test\(", source, re.M))
    proc = subprocess.run(["node", "--test", str(suite)], cwd=SDK, env=node_env,
                          capture_output=True, text=True, timeout=1100)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report[-6000:]
    assert re.search(rf"^# pass {count}$", report, re.M), report[-3000:]
    assert re.search(r"^# fail 0$", report, re.M), report[-3000:]
    assert live_sandboxes(live_server, "sdk-ts") == []


def readme_script() -> str:
    """The TypeScript quickstart: the first ```js block after README's TypeScript heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## TypeScript"):]
    match = re.search(r"```js\n(.*?)```", section, re.S)
    assert match, "README's TypeScript section has no ```js block"
    return match.group(1)


@pytest.mark.timeout(900)
def test_packed_tarball_runs_the_readme_quickstart(built: Path, node_env: dict[str, str],
                                                    live_server: LiveServer,
                                                    tmp_path: Path) -> None:
    script = readme_script()
    assert len(script.strip().splitlines()) <= 12, "the quickstart should stay about ten lines"
    packed = subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(tmp_path)],
                            cwd=SDK, capture_output=True, text=True, check=True, timeout=300)
    tarball = tmp_path / packed.stdout.strip().splitlines()[-1]
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
    # Its one dependency (ws, for terminals) comes from the npm cache that build.sh's
    # `npm ci` filled, so this works offline once the SDK was built.
    cache = subprocess.run(["npm", "config", "get", "cache"], capture_output=True, text=True,
                           check=True).stdout.strip()
    subprocess.run(["npm", "install", "--prefer-offline", "--no-audit", "--no-fund",
                    str(tarball)], cwd=app, env={**node_env, "npm_config_cache": cache},
                   check=True, capture_output=True, timeout=300)
    installed = app / "node_modules" / "pandastack"
    assert (installed / "dist" / "src" / "index.d.ts").is_file()
    assert not (installed / "dist" / "test").exists()  # tests are not shipped
    (app / "quickstart.mjs").write_text(script)
    before = live_sandboxes(live_server)
    proc = subprocess.run(["node", "quickstart.mjs"], cwd=app, env=node_env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 hello from the sandbox" in proc.stdout, proc.stdout
    assert live_sandboxes(live_server) == before  # the script killed what it made
