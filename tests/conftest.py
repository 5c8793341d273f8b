"""Shared fixtures. VM tests share one runtime whose state dir is private to the test session,
so the session can assert that everything it created was removed, while the (slow to build)
guest image and template cache under PANDASTACK_HOME is shared with every other run. The
session's one PostgreSQL and one S3 server are here too, so that no suite starts its own
(each test takes a database or a key prefix of its own on them)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from tests.helpers import SandboxFactory, vmm_pids_under
from tests.host.objects.s3_server import s3_server
from tests.lanes import (  # noqa: F401  (hooks: the lanes' order, soak variants, report)
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_terminal_summary,
)
from tests.leftovers import owned_tmpdir, reap
from tests.services import Postgres, postgres_server

# Network safety: guests in tests never get the host's real resolver. The tests that need
# DNS give their runtime a stub resolver inside a namespace they create.
os.environ["PANDASTACK_DNS"] = "off"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before anything runs, what killed runs left behind goes (tests/leftovers.py), said on
    the terminal; an xdist worker leaves that to the run's controller."""
    if hasattr(session.config, "workerinput"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reap(say=reporter.write_line if reporter is not None else print)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """The session's PostgreSQL server; `Postgres.database()` makes a test's own database."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def s3_env() -> Iterator[dict[str, str]]:
    """The session's S3 server's environment (PANDASTACK_S3_ENDPOINT, ...); a test or a
    module stores under a prefix of its own."""
    with s3_server() as env:
        yield env


@pytest.fixture(scope="session")
def state_dir() -> Iterator[Path]:
    # Short path: unix socket paths inside it must stay under 108 bytes.
    path = owned_tmpdir("pst-")
    yield path
    leftovers = vmm_pids_under(path)
    for pid in leftovers:
        os.kill(pid, 9)
    shutil.rmtree(path, ignore_errors=True)
    assert not leftovers, f"VMM processes leaked by the test session: {leftovers}"


@pytest.fixture(scope="session")
def snapshots_dir(state_dir: Path) -> Iterator[Path]:
    path = Path(f"{state_dir}-snapshots")
    path.mkdir()
    yield path
    left = sorted(p.name for p in path.iterdir())
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"snapshots left behind by the test session: {left}"


@pytest.fixture(scope="session")
def volumes_dir(state_dir: Path) -> Iterator[Path]:
    path = Path(f"{state_dir}-volumes")
    path.mkdir()
    yield path
    left = sorted(p.name for p in path.iterdir())
    shutil.rmtree(path, ignore_errors=True)
    assert not left, f"volumes left behind by the test session: {left}"


@pytest.fixture(scope="session")
def host_config(state_dir: Path, snapshots_dir: Path, volumes_dir: Path) -> HostConfig:
    if os.geteuid() != 0:
        pytest.fail("VM tests need root (the VMM, network namespaces, /var/lib/pandastack)")
    return HostConfig.from_env(state_dir=state_dir, snapshots_root=snapshots_dir,
                               volumes_root=volumes_dir)


@pytest.fixture(scope="session")
async def runtime(host_config: HostConfig) -> AsyncIterator[HostRuntime]:
    rt = HostRuntime(host_config)
    await rt.start()
    await rt.ensure_template("base")
    yield rt
    await rt.kill_all()
    await rt.close()
    remaining = [p.name for p in host_config.sandboxes_dir.iterdir()]
    assert remaining == [], f"sandbox directories left behind: {remaining}"
    ours = [i for i, owner in rt.network.claims().items()
            if str(owner).startswith(str(host_config.sandboxes_dir))]
    assert ours == [], f"network slots still claimed: {ours}"


@pytest.fixture
async def sandbox_factory(runtime: HostRuntime) -> AsyncIterator[SandboxFactory]:
    """Creates sandboxes and always kills the ones the test did not kill itself."""
    made: list[SandboxHandle] = []

    async def make(**kwargs: object) -> SandboxHandle:
        handle = await runtime.create(**kwargs)  # type: ignore[arg-type]
        made.append(handle)
        return handle

    yield make
    for handle in made:
        if handle.id in {h.id for h in runtime.list()}:
            await runtime.kill(handle.id)


@pytest.fixture
async def sandbox(sandbox_factory: SandboxFactory) -> SandboxHandle:
    return await sandbox_factory()
