"""The runtime asks its VMM driver what it can do (`VMMDriver.capabilities`, ADR 0043) instead of
assuming QEMU: with the fake driver declaring fewer capabilities, each operation that needs a
missing one is refused before it changes anything, with an error naming the capability (a
SandboxStateError: a 409 wherever host errors are mapped), or takes its other path; the
sandbox keeps running either way. No root, no VM (tests/host/fake_vmm.py)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import cast

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.disk_layers import MAX_LAYERS
from pandastack.host.vmm.driver import Capability, CapabilityMissing
from pandastack.host.vmm.qemu import QemuDriver
from pandastack.hostport.errors import SandboxStateError
from pandastack.hostport.host_api.codec import decode_error, encode_error, status_of
from tests.helpers import close_private_runtime, private_vmm_root
from tests.host import fake_vmm
from tests.host.fake_vmm import FakeDriver
from tests.host.runtime.test_runtime_fake_vmm import fake_images

pytestmark = pytest.mark.timeout(120)

_numbers = itertools.count()


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    with private_vmm_root("psc-") as path:
        yield path


@pytest.fixture
async def rt(root: Path) -> AsyncIterator[HostRuntime]:
    n = next(_numbers)
    state, snapshots = root / f"s{n}", root / f"snaps{n}"
    for directory in (state, snapshots):
        directory.mkdir(mode=0o700)
    # A fork buffer is configured: only the driver's capabilities keep forks out of it.
    config = HostConfig(home=root / "home", state_dir=state, snapshots_root=snapshots,
                        vmm=fake_vmm.NAME, networking=False, memory_stage_dir=None,
                        fork_buffer_s=60, stream_hugetlb_mb=0, dns="off")
    runtime = HostRuntime(config, progress=lambda message: None,
                          images=fake_images(config.home))
    await runtime.start()
    yield runtime
    left = await close_private_runtime(runtime, config.sandboxes_dir, config.snapshots_dir)
    assert left == ([], []), left


def fake(runtime: HostRuntime, *without: Capability) -> FakeDriver:
    driver = cast(FakeDriver, runtime.driver)
    driver.capabilities = driver.capabilities - set(without)
    return driver


async def still_runs(runtime: HostRuntime, sandbox_id: str) -> None:
    handle = runtime.get(sandbox_id)
    assert handle.state == "running" and handle.is_alive()
    assert (await handle.exec(["echo", "here"])).stdout == b"here\n"


def test_qemu_declares_every_capability_and_the_fake_fewer() -> None:
    assert QemuDriver("tcg").capabilities == frozenset(Capability)
    assert Capability.LIVE_MIGRATION not in fake_vmm.CAPABILITIES
    assert frozenset(Capability) > fake_vmm.CAPABILITIES


def test_the_error_names_the_capability_and_crosses_the_host_api_as_a_409() -> None:
    exc = CapabilityMissing("fake", Capability.LIVE_MIGRATION, "live migration")
    message = ("live migration is not supported on this host: its VMM driver 'fake' has no "
               "live migration")
    assert isinstance(exc, SandboxStateError) and str(exc) == message
    assert status_of(exc) == 409
    crossed = decode_error(encode_error(exc).error)
    assert type(crossed) is SandboxStateError and str(crossed) == message


async def test_a_driver_without_live_migration_refuses_both_sides_and_runs_on(
        rt: HostRuntime) -> None:
    driver = fake(rt)
    handle = await rt.create()
    with pytest.raises(CapabilityMissing) as refused:
        await rt.migrations.offer(handle.id)
    assert refused.value.capability is Capability.LIVE_MIGRATION
    offer = {"format": 1, "driver": driver.identity(), "id": "sbx-00000000abcd", "record": {}}
    with pytest.raises(CapabilityMissing):
        await rt.migrations.accept("sbx-00000000abcd", offer, "127.0.0.1")
    assert not (rt.sandboxes_dir / "sbx-00000000abcd").exists()
    assert not {"start_incoming", "migrate_out", "pause"} & set(driver.calls)
    await still_runs(rt, handle.id)
    await rt.kill(handle.id)


async def test_without_short_pause_saves_a_snapshot_stops_the_guest_or_refuses_by_name(
        rt: HostRuntime) -> None:
    driver = fake(rt, Capability.SHORT_PAUSE_SAVES)
    handle = await rt.create()
    layers = rt.table.record(handle.id).layers
    with pytest.raises(CapabilityMissing, match="short-pause snapshots"):
        await rt.snapshot(handle.id, short_pause=True)
    assert driver.saves == [] and rt.table.record(handle.id).layers == layers
    snap = await rt.snapshot(handle.id)  # a user's snapshot: short by default where it can
    assert driver.saves == [(False, False)]
    await still_runs(rt, handle.id)
    await rt.kill(handle.id)
    rt.delete_snapshot(snap.info.id)


async def test_a_driver_that_declares_short_pause_saves_is_asked_for_them(
        rt: HostRuntime) -> None:
    driver = fake(rt)
    handle = await rt.create()
    snap = await rt.snapshot(handle.id)
    assert driver.saves == [(True, False)]
    await rt.kill(handle.id)
    rt.delete_snapshot(snap.info.id)


async def test_without_saves_in_place_a_fork_streams_into_its_own_file(
        rt: HostRuntime) -> None:
    driver = fake(rt, Capability.STREAM_IN_PLACE)
    parent = await rt.create()
    for _ in range(2):
        [child] = await rt.fork(parent.id)
        await still_runs(rt, child.id)
        await rt.kill(child.id)
    # No warm buffer was even prepared for the next fork (it would say "warming").
    assert driver.saves == [(False, False)] * 2 and rt.fork_buffer.state == "none"
    await still_runs(rt, parent.id)
    await rt.kill(parent.id)


async def test_without_disk_resize_a_larger_disk_is_refused_before_anything_is_made(
        rt: HostRuntime) -> None:
    driver = fake(rt)
    assert Capability.DISK_RESIZE not in driver.capabilities
    with pytest.raises(CapabilityMissing, match="root disk resize"):
        await rt.create(disk_mb=1 << 10)
    assert "restore" not in driver.calls and list(rt.sandboxes_dir.iterdir()) == []
    assert rt.list() == []


async def test_without_layer_flattening_no_merge_starts_and_the_chain_stays(
        rt: HostRuntime) -> None:
    fake(rt)
    handle = await rt.create()
    snaps = [await rt.snapshot(handle.id, internal=True) for _ in range(MAX_LAYERS)]
    assert len(rt.table.record(handle.id).layers) == MAX_LAYERS + 1
    assert not rt.merges.under_way(handle.id)
    await still_runs(rt, handle.id)
    await rt.kill(handle.id)
    for snap in snaps:
        rt.delete_snapshot(snap.info.id)
