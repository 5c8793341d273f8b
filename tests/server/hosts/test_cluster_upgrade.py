"""The rolling upgrade of docs/operations.md, section 6, from the newest release to this
tree, on real agents and microVMs, PostgreSQL and the S3 server: an agent of the release
(installed from its tag by scripts/release-install.sh, as an operator installs it) and one of
this tree register beside an API server of this tree. The release's agent serves a sandbox
and hibernates another; a drain moves the running one live onto this tree's agent; the
release's agent then runs a third and is upgraded in place (SIGTERM, which leaves its VMs
running, as the unit's `systemctl stop` does; then this tree's agent on the same
directories), which adopts that VM; the hibernation the release wrote wakes on this tree.
The memory a process holds in each sandbox is asked of it after every step.

When a release raises the host API or guest protocol past what the next tree speaks, this
test is where it shows: such a change says so in CHANGELOG.md and here (docs/releasing.md)."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pandastack._version import __version__
from tests.registry.conftest import member_agent
from tests.server.hosts.cluster_rig import (
    CALM_STALE_S,
    HEARTBEAT_S,
    api_servers,
    host_ids,
    registry_of,
    until,
    write_token,
)
from tests.server.hosts.test_cluster_objects import holder, ok, store_url, told

pytestmark = [pytest.mark.vm, pytest.mark.serial, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "release-install.sh"


@dataclass(frozen=True)
class Release:
    version: str
    python: str  # its venv's interpreter


def release_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.fixture(scope="module")
def last_release() -> Release:
    version = release_script("version")
    assert version.returncode == 0, version.stderr
    found = release_script("commit")
    if found.returncode == 3:  # a shallow clone holds no release to install
        pytest.skip(found.stderr.strip())
    assert found.returncode == 0, found.stderr
    filled = release_script("fill", sys.executable)
    assert filled.returncode == 0, filled.stderr
    return Release(version.stdout.strip(), filled.stdout.strip().splitlines()[-1])


async def test_a_cluster_upgrades_from_the_last_release_to_this_tree(
        pg_dsn: str, tmp_path: Path, s3_env: dict[str, str], last_release: Release) -> None:
    flags = ("--heartbeat-s", str(HEARTBEAT_S), "--stale-after-s", str(CALM_STALE_S),
             "--object-store", store_url(s3_env))
    with registry_of(pg_dsn) as registry:
        async with member_agent(pg_dsn, *flags) as old, member_agent(pg_dsn, *flags) as new:
            write_token(old.token_file, secrets.token_urlsafe(32))
            write_token(new.token_file, old.token)
            old.python = last_release.python
            old.start()
            new.start()
            async with api_servers(tmp_path, pg_dsn, old.token_file, count=1,
                                   stale_s=CALM_STALE_S) as (api,):
                id_old, id_new = host_ids(registry, [old, new])

                async def host(host_id: str) -> dict[str, object]:
                    return await ok(await api.client.get(f"/v1/hosts/{host_id}"))

                for host_id, version in ((id_old, last_release.version),
                                         (id_new, __version__)):
                    info = await host(host_id)
                    assert (info["version"], info["state"]) == (version, "live"), info

                # The release's agent serves this tree's API server.
                moved = str((await ok(await api.client.post("/v1/sandboxes", json={
                    "host_id": id_old, "ttl_seconds": 3600}), 201))["id"])
                moved_pid, moved_value = await holder(api, moved)
                asleep = str((await ok(await api.client.post("/v1/sandboxes", json={
                    "host_id": id_old, "ttl_seconds": 3600}), 201))["id"])
                asleep_pid, asleep_value = await holder(api, asleep)
                await ok(await api.client.post(f"/v1/sandboxes/{asleep}/hibernate"))

                # Its drain moves the running sandbox live onto this tree's agent; the
                # hibernated one stays in the object store, as the release wrote it.
                report = await ok(await api.client.post(f"/v1/hosts/{id_old}/drain"))
                assert report["moved"] == {moved: id_new}, report
                assert report["moved_live"] == [moved], report
                assert report["stayed_hibernated"] == [asleep], report
                assert await told(api, moved, moved_pid) == moved_value
                await ok(await api.client.post(f"/v1/hosts/{id_old}/undrain"))

                # Upgraded in place: the release's VM left running, adopted by this tree's
                # agent on the same directories.
                kept = str((await ok(await api.client.post("/v1/sandboxes", json={
                    "host_id": id_old, "ttl_seconds": 3600}), 201))["id"])
                kept_pid, kept_value = await holder(api, kept)
                assert old.signal(signal.SIGTERM) == 0, old.log_tail()
                old.python = sys.executable
                old.start()

                async def upgraded() -> bool:
                    info = await host(id_old)
                    return info["version"] == __version__ and info["state"] == "live"

                await until("the upgraded agent to register at this version", upgraded)
                assert await told(api, kept, kept_pid) == kept_value
                info = await ok(await api.client.get(f"/v1/sandboxes/{kept}"))
                assert info["host_id"] == id_old, info
                assert await told(api, moved, moved_pid) == moved_value
                # A hibernation the release made wakes on this tree's agents.
                await ok(await api.client.post(f"/v1/sandboxes/{asleep}/wake"))
                assert await told(api, asleep, asleep_pid) == asleep_value

                for sid in (moved, kept, asleep):
                    r = await api.client.delete(f"/v1/sandboxes/{sid}")
                    assert r.status_code == 204, r.text
