"""The runtime's object store paths when the store does not answer, with the fake VMM (no
root, no VM): nothing a caller cannot use is left behind, and what needs no store works."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.objects import ObjectStoreConfig
from pandastack.host.runtime import HostRuntime
from pandastack.hostport.errors import ObjectStoreUnavailable, SandboxNotFound
from tests.helpers import close_private_runtime
from tests.host.runtime.test_runtime_fake_vmm import config, new_runtime, root

__all__ = ["config", "root"]  # the fake runtime's fixtures, used here too

pytestmark = pytest.mark.timeout(120)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def rt(config: HostConfig) -> AsyncIterator[HostRuntime]:
    store = ObjectStoreConfig(bucket="pandastack", endpoint=f"http://127.0.0.1:{closed_port()}",
                              access_key="a", secret_key="s", max_attempts=1,
                              connect_timeout_s=0.5)
    runtime = new_runtime(replace(config, object_store=store,
                                  objects_cache=config.sandboxes_dir.parent / "objects-cache"))
    await runtime.start()  # the store is not asked anything yet
    yield runtime
    left = await close_private_runtime(runtime, config.sandboxes_dir, config.snapshots_dir)
    assert left == ([], []), left


async def test_a_snapshot_that_cannot_be_published_is_not_kept(rt: HostRuntime) -> None:
    sbx = await rt.create()
    with pytest.raises(ObjectStoreUnavailable):
        await rt.snapshot(sbx.id, "kept")
    assert rt.snapshots.all(include_internal=True) == []
    assert list(rt.config.snapshots_dir.iterdir()) == []
    assert sbx.state == "running"
    # A fork's transient snapshot is not published: forks need no store.
    (child,) = await rt.fork(sbx.id)
    assert rt.snapshots.all(include_internal=True) == []
    await rt.kill(child.id)


async def test_a_hibernation_that_cannot_be_published_stays_here(rt: HostRuntime) -> None:
    sbx = await rt.create()
    with pytest.raises(ObjectStoreUnavailable):
        await rt.hibernate(sbx.id)
    assert sbx.state == "hibernated"  # and wakes here
    await rt.wake(sbx.id)
    assert sbx.state == "running"
    await rt.kill(sbx.id)  # never in the store: the kill asks it nothing
    with pytest.raises(SandboxNotFound):
        rt.get(sbx.id)


async def test_what_this_host_lacks_is_asked_of_the_store(rt: HostRuntime) -> None:
    with pytest.raises(ObjectStoreUnavailable):
        await rt.create(snapshot="snap-000000000000")
    with pytest.raises(ObjectStoreUnavailable):
        await rt.wake("sbx-000000000000")
    with pytest.raises(SandboxNotFound):  # not a sandbox id: no request
        await rt.wake("nope")
    assert list(rt.sandboxes_dir.iterdir()) == []
