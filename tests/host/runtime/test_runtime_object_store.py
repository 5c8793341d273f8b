"""Snapshots and hibernation through the object store (ADR 0020), on real VMs and a real S3
server: two runtimes on this machine with their own state, snapshot and cache directories
stand for two hosts that share only the store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.objects import ObjectStoreConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.remote import RemoteState, sandbox_manifest, snapshot_manifest
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.errors import SandboxNotFound, SnapshotNotFound
from tests.helpers import vmm_pids_under
from tests.leftovers import owned_tmpdir

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def store_config(s3_env: dict[str, str]) -> ObjectStoreConfig:
    # One prefix for the module: the template's files are uploaded once for all its tests.
    url = f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/rt-{uuid.uuid4().hex[:12]}"
    return ObjectStoreConfig.from_url(url, s3_env)


@dataclass
class Host:
    rt: HostRuntime
    root: Path  # state, snapshots and object cache (with the templates it fetched) below

    @property
    def remote(self) -> RemoteState:
        assert self.rt.remote is not None
        return self.rt.remote

    @property
    def downloads(self) -> int:
        return self.remote.store.stats.downloads


MakeHost = Callable[[], Awaitable[Host]]


@contextlib.asynccontextmanager
async def runtimes(host_config: HostConfig, store_config: ObjectStoreConfig,
                   **fields: object) -> AsyncIterator[MakeHost]:
    """Runtimes that share the template cache's home (images, network claims) and the object
    store, nothing else (`fields`: more of HostConfig's, the same for each); each is
    closed and its directories checked and removed after."""
    hosts: list[Host] = []

    async def make() -> Host:
        # Short: the VMs' unix sockets live below.
        root = owned_tmpdir("pso-")
        for part in ("s", "snaps"):
            (root / part).mkdir()
        config = HostConfig.from_env(home=host_config.home, state_dir=root / "s",
                                     snapshots_root=root / "snaps", object_store=store_config,
                                     objects_cache=root / "cache" / "objects-cache",
                                     **fields)
        rt = HostRuntime(config, progress=lambda m: None)
        await rt.start()
        hosts.append(Host(rt, root))
        return hosts[-1]

    yield make
    left = []
    for host in hosts:
        if host.root.exists():  # not a host the test lost on purpose
            await host.rt.kill_all()
            for info in host.rt.snapshots.all(include_internal=True):
                await asyncio.to_thread(host.rt.delete_snapshot, info.id)
            await host.rt.close()
            left += [f"{host.root}: {p}" for part in ("s", "snaps")
                     for p in (host.root / part).iterdir()]
            left += [f"pid {pid}" for pid in vmm_pids_under(host.root)]
            shutil.rmtree(host.root, ignore_errors=True)
        ours = [i for i, owner in hosts[0].rt.network.claims().items()
                if str(owner).startswith(str(host.root))]
        left += [f"slot {i}" for i in ours]
    assert left == [], f"left behind: {left}"


@pytest.fixture
async def make_host(host_config: HostConfig,
                    store_config: ObjectStoreConfig) -> AsyncIterator[MakeHost]:
    """A test's own hosts (`runtimes`)."""
    async with runtimes(host_config, store_config) as make:
        yield make


async def _start_sleeper(sbx: SandboxHandle) -> int:
    await sbx.write_file("/work/note", b"written before")
    return await sbx.spawn(["sleep", "3600"])


async def _assert_resumed(sbx: SandboxHandle, pid: int) -> None:
    assert await sbx.read_file_bytes("/work/note") == b"written before"
    procs = await sbx.procs()
    assert any(p.get("pid") == pid and p.get("running") for p in procs), procs
    assert (await sbx.exec("pgrep -x sleep")).exit_code == 0


def _chain(top: Path) -> list[str]:
    out = subprocess.run(["qemu-img", "info", "-U", "--backing-chain", "--output=json",
                          str(top)], capture_output=True, text=True, check=True)
    return [image["filename"] for image in json.loads(out.stdout)]


async def test_a_snapshot_taken_on_one_host_creates_on_another(make_host: MakeHost) -> None:
    a, b = await make_host(), await make_host()
    parent = await a.rt.create()
    pid = await _start_sleeper(parent)
    snap = (await a.rt.snapshot(parent.id, "shared")).info
    manifest = await a.remote.store.get_manifest(snapshot_manifest(snap.id))
    assert manifest is not None and json.loads(manifest)["snapshot"]["name"] == "shared"
    assert not b.rt.snapshots.path(snap.id).exists()

    assert (await b.rt.snapshot_info(snap.id)).name == "shared"  # fetched here
    first = await b.rt.create(snapshot=snap.id)
    await _assert_resumed(first, pid)
    fetched = b.downloads
    assert fetched >= 5  # chunks of stream, layer, template disk, rootfs, kernel, initrd
    # The rootfs is mostly holes: neither sent nor fetched, and a hole again on this host.
    template = Path(b.rt.snapshots.get(snap.id).template_path)
    rootfs = next(template.glob("backing-*"))
    assert rootfs.stat().st_blocks * 512 < rootfs.stat().st_size // 2
    assert a.remote.store.stats.holes > 0
    assert a.remote.store.stats.chunk_bytes_uploaded < rootfs.stat().st_size
    # The chain is this host's own: nothing of the other host's paths.
    chain = _chain(first.workdir / b.rt.describe(first.id)["layers"][-1])  # type: ignore[index]
    assert all(name.startswith(str(b.root)) for name in chain), chain
    hits = b.remote.store.stats.cache_hits

    second = await b.rt.create(snapshot=snap.id)
    await _assert_resumed(second, pid)
    assert b.downloads == fetched  # nothing fetched twice
    assert b.remote.store.stats.cache_hits == hits  # the snapshot is this host's now

    # A second snapshot on A sends nothing of the template (the store has its chunks, and
    # A knows it): only chunks of its stream and layers.
    sent = a.remote.store.stats.chunk_uploads
    again = (await a.rt.snapshot(parent.id, "again")).info
    new_chunks = a.remote.store.stats.chunk_uploads - sent
    manifest = json.loads(await a.remote.store.get_manifest(snapshot_manifest(again.id)) or b"")
    own = {k for ref in (manifest["stream"], *manifest["layers"]) for k in ref["chunks"] if k}
    assert 0 < new_chunks <= len(own)
    await asyncio.to_thread(a.rt.delete_snapshot, again.id)

    await b.rt.kill(first.id)
    await b.rt.kill(second.id)
    await asyncio.to_thread(a.rt.delete_snapshot, snap.id)
    assert await a.remote.store.get_manifest(snapshot_manifest(snap.id)) is None
    await asyncio.to_thread(b.rt.delete_snapshot, snap.id)  # its own copy
    with pytest.raises(SnapshotNotFound):
        await b.rt.snapshot_info(snap.id)
    with pytest.raises(SnapshotNotFound):
        await b.rt.create(snapshot=snap.id)


async def test_a_sandbox_hibernated_on_a_lost_host_wakes_on_another(
        make_host: MakeHost) -> None:
    a, b = await make_host(), await make_host()
    sbx = await a.rt.create()
    pid = await _start_sleeper(sbx)
    other = await a.rt.create()
    await a.rt.hibernate(sbx.id)
    await a.rt.hibernate(other.id)
    assert await a.remote.store.get_manifest(sandbox_manifest(sbx.id)) is not None

    # The host is lost: its runtime gone, its state dir with it.
    await a.rt.close()
    shutil.rmtree(a.root)
    # What the lost host's sandboxes held in this machine's network (their directories are
    # gone): a real lost host takes it with it.
    await asyncio.to_thread(b.rt.network.sweep)

    with pytest.raises(SandboxNotFound):
        b.rt.get(sbx.id)
    await b.rt.wake(sbx.id)
    woken = b.rt.get(sbx.id)
    assert woken.state == "running"
    await _assert_resumed(woken, pid)
    chain = _chain(woken.workdir / b.rt.describe(sbx.id)["layers"][-1])  # type: ignore[index]
    assert all(name.startswith(str(b.root)) for name in chain), chain
    # Its snapshot (of a template this host fetched) restores on a third host.
    snap = (await b.rt.snapshot(sbx.id)).info
    c = await make_host()
    third = await c.rt.create(snapshot=snap.id)
    await _assert_resumed(third, pid)
    await c.rt.kill(third.id)

    await b.rt.kill(sbx.id)
    assert await b.remote.store.get_manifest(sandbox_manifest(sbx.id)) is None
    # One nobody woke: killed from another host, it is gone from the store too.
    await b.rt.kill(other.id)
    assert await b.remote.store.get_manifest(sandbox_manifest(other.id)) is None
    with pytest.raises(SandboxNotFound):
        await b.rt.wake(other.id)


async def test_a_host_dropping_its_stale_copy_leaves_the_newer_hibernation(
        make_host: MakeHost) -> None:
    """A hibernates S; B wakes it (a drain, or A was lost) and hibernates it again; then A
    drops its own copy of S (the drain's cleanup, or a fenced host coming back): the state
    B saved must stay in the store, and a third host wakes it with its processes."""
    a, b = await make_host(), await make_host()
    sbx = await a.rt.create()
    pid = await _start_sleeper(sbx)
    await a.rt.hibernate(sbx.id)
    await b.rt.wake(sbx.id)
    await b.rt.get(sbx.id).write_file("/work/later", b"after the move")
    await b.rt.hibernate(sbx.id)

    await a.rt.kill(sbx.id)  # A's copy: still hibernated there, now stale
    assert await a.remote.store.get_manifest(sandbox_manifest(sbx.id)) is not None
    await b.rt.close()
    shutil.rmtree(b.root)  # B is lost too
    c = await make_host()
    await asyncio.to_thread(c.rt.network.sweep)
    await c.rt.wake(sbx.id)
    woken = c.rt.get(sbx.id)
    await _assert_resumed(woken, pid)
    assert await woken.read_file_bytes("/work/later") == b"after the move"
    await c.rt.kill(sbx.id)
    assert await c.remote.store.get_manifest(sandbox_manifest(sbx.id)) is None
