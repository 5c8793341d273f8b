"""The runtime's own logic with the fake VMM driver (tests/host/fake_vmm.py): no root, no VM.

Create rolls back whatever it made when the driver fails, a restarted runtime re-adopts what
its records and the driver's `owns` vouch for (and nothing else), and a failed snapshot leaves
the sandbox running and no snapshot behind. The sandboxes have no network
(`HostConfig.networking=False`), and guest images are empty files.
"""

from __future__ import annotations

import itertools
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.images.build import GuestImage
from pandastack.host.memory.admission import TCG_START_MB, VMM_FIXED_MB, MemoryAdmission
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.records import SandboxRecord
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import Capability
from pandastack.hostport.errors import HostMemoryExhausted, SnapshotFailed, VMMError
from tests.helpers import close_private_runtime, private_vmm_root, vmm_pids_under
from tests.host import fake_vmm
from tests.host.fake_vmm import FakeDriver

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
ROOTFS_MB = 64
_numbers = itertools.count()


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """Home (shared by the module's runtimes: the template is baked once), state dirs, and
    the host-wide claim directories, all private to this module."""
    with private_vmm_root("psf-") as path:
        yield path


def fake_images(home: Path) -> Callable[[str, object], GuestImage]:
    def find(variant: str, progress: object) -> GuestImage:
        directory = home / "images" / f"fake-{variant}"
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("vmlinux", "initrd.img"):
            (directory / name).touch()
        rootfs = directory / "rootfs.img"
        with open(rootfs, "ab") as f:
            f.truncate(ROOTFS_MB * MIB)
        return GuestImage(key=f"fake-{variant}", kernel=directory / "vmlinux",
                          initrd=directory / "initrd.img", rootfs=rootfs,
                          kernel_version="fake", cmdline="console=ttyS0", variant=variant)
    return find


@pytest.fixture
def config(root: Path) -> HostConfig:
    n = next(_numbers)
    state, snapshots = root / f"s{n}", root / f"snaps{n}"
    for directory in (state, snapshots):
        directory.mkdir(mode=0o700)
    return HostConfig(home=root / "home", state_dir=state, snapshots_root=snapshots,
                      vmm=fake_vmm.NAME, networking=False, memory_stage_dir=None,
                      fork_buffer_s=0, stream_hugetlb_mb=0, dns="off")


def new_runtime(config: HostConfig) -> HostRuntime:
    return HostRuntime(config, progress=lambda message: None, images=fake_images(config.home))


@pytest.fixture
async def rt(config: HostConfig) -> AsyncIterator[HostRuntime]:
    runtime = new_runtime(config)
    await runtime.start()
    yield runtime
    left = await close_private_runtime(runtime, config.sandboxes_dir, config.snapshots_dir)
    assert left == ([], []), left


def driver_of(runtime: HostRuntime) -> FakeDriver:
    return cast(FakeDriver, runtime.driver)


def assert_holds_only(runtime: HostRuntime, *sandbox_ids: str) -> None:
    """The runtime holds these sandboxes and nothing else: no other directory, VMM process,
    network slot or snapshot."""
    assert sorted(h.id for h in runtime.list()) == sorted(sandbox_ids)
    assert sorted(p.name for p in runtime.sandboxes_dir.iterdir()) == sorted(sandbox_ids)
    expected = sorted(h.pid for h in runtime.list() if h.pid is not None)
    assert sorted(vmm_pids_under(runtime.sandboxes_dir)) == expected
    # The claims dir is the machine's (ADR 0021): only this runtime's claims count.
    assert [i for i, owner in runtime.network.claims().items()
            if owner.is_relative_to(runtime.sandboxes_dir)] == []
    assert list(runtime.config.snapshots_dir.iterdir()) == []


async def test_a_sandbox_runs_on_the_fake_vmm_and_leaves_nothing(rt: HostRuntime) -> None:
    sbx = await rt.create()
    assert (await sbx.exec(["echo", "hello"])).stdout == b"hello\n"
    top = sbx.workdir / rt.describe(sbx.id)["layers"][-1]  # type: ignore[index]
    chain = rt.driver.disks.layer_chain(top)
    assert chain[0] == top and chain[-1].name == "rootfs.img" and len(chain) == 3
    assert rt.driver.disks.virtual_size(top) == ROOTFS_MB * MIB
    await rt.kill(sbx.id)
    assert_holds_only(rt)


async def test_create_rolls_back_when_the_restore_fails(rt: HostRuntime) -> None:
    driver_of(rt).fail["restore"] = [VMMError("no restore today")]
    with pytest.raises(VMMError, match="no restore today"):
        await rt.create()
    assert_holds_only(rt)
    sbx = await rt.create()  # the runtime is none the worse for it
    assert_holds_only(rt, sbx.id)


async def test_create_rolls_back_a_vm_that_already_runs(rt: HostRuntime) -> None:
    driver = driver_of(rt)
    # As if it could grow disks (it cannot: no DISK_RESIZE), so the create gets that far.
    driver.capabilities = driver.capabilities | {Capability.DISK_RESIZE}
    driver.fail["resize_disk"] = [VMMError("the disk cannot grow")]
    with pytest.raises(VMMError, match="cannot grow"):
        await rt.create(disk_mb=2 * ROOTFS_MB)
    assert driver.calls[-2:] == ["restore", "resize_disk"]  # its VMM had started
    assert_holds_only(rt)


async def test_a_failed_fork_kills_the_children_it_made(rt: HostRuntime) -> None:
    parent = await rt.create()
    driver_of(rt).fail["restore"] = [None, VMMError("the second child fails")]
    with pytest.raises(VMMError, match="second child"):
        await rt.fork(parent.id, count=2)
    assert_holds_only(rt, parent.id)
    assert (await parent.exec(["echo", "parent"])).stdout == b"parent\n"


async def test_a_fork_reports_the_parents_pause_and_sets_its_clock_again_once(
        rt: HostRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's guest stood stopped for the fork's save: its pause comes back with the
    children, and its clock is set again once (while the children restore, not before)."""
    parent = await rt.create()
    synced: list[str] = []
    resync = parent.resync_clock

    async def recorded(machine_id: str) -> None:
        synced.append(machine_id)
        await resync(machine_id)

    monkeypatch.setattr(parent, "resync_clock", recorded)
    children = await rt.fork(parent.id, count=2)
    assert children.parent_pause_ms == 0.1  # the fake VMM's nominal pause
    assert synced == [rt.table.record(parent.id).machine_id]
    for child in children:
        assert (await child.exec(["echo", "child"])).stdout == b"child\n"
        await rt.kill(child.id)
    assert (await parent.exec(["echo", "parent"])).stdout == b"parent\n"


def neighbour(config: HostConfig, root: Path) -> HostRuntime:
    """A runtime with a state dir of its own and the snapshots directory of `config`."""
    state = root / f"s{next(_numbers)}"
    state.mkdir(mode=0o700)
    return new_runtime(replace(config, state_dir=state))


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_fork_under_way_survives_the_start_of_a_runtime_sharing_its_snapshots(
        rt: HostRuntime, config: HostConfig, root: Path, when: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Runtimes with their own state dirs share a snapshots directory by default (under
    PANDASTACK_HOME), and each one's start sweeps the transient snapshots that crashed forks
    left. One starting while a fork is under way (before or after its child is made) must
    leave that fork's snapshot alone: a fresh-clone CI run saw fork answer 404 for its own
    snapshot, with its child left running."""
    parent = await rt.create()
    other = neighbour(config, root)
    create = rt.create

    async def create_beside_a_start(**kwargs: object) -> SandboxHandle:
        if when == "before":
            await other.start()
        child = await create(**kwargs)  # type: ignore[arg-type]
        if when == "after":
            await other.start()
        return child

    monkeypatch.setattr(rt, "create", create_beside_a_start)
    try:
        [child] = await rt.fork(parent.id)
    finally:
        monkeypatch.undo()
        await other.close()
        shutil.rmtree(other.sandboxes_dir, ignore_errors=True)
    assert other.list() == []
    assert (await child.exec(["echo", "child"])).stdout == b"child\n"
    assert_holds_only(rt, parent.id, child.id)


async def test_a_start_sweeps_the_transient_snapshot_of_a_fork_cut_short(
        rt: HostRuntime, config: HostConfig, root: Path) -> None:
    """The other half: a transient snapshot no fork holds any more (its process died,
    which drops the lock) goes at the next start."""
    parent = await rt.create()
    snap = await rt.saves.snapshot(parent.id, internal=True, transient=True)
    rt.snapshots._release(snap.info.id)  # as the death of the forking process would
    other = neighbour(config, root)
    try:
        await other.start()
    finally:
        await other.close()
        shutil.rmtree(other.sandboxes_dir, ignore_errors=True)
    assert_holds_only(rt, parent.id)  # no snapshot left


async def test_a_failed_snapshot_leaves_the_sandbox_running_and_no_snapshot(
        rt: HostRuntime) -> None:
    sbx = await rt.create()
    driver = driver_of(rt)

    def layers() -> list[str]:
        listed = rt.describe(sbx.id)["layers"]
        assert isinstance(listed, list)
        on_disk = sorted(p.name for p in sbx.workdir.glob(f"layer-*{rt.driver.disks.suffix}"))
        assert on_disk == sorted(listed)  # no layer left over, none missing
        return listed

    before = layers()
    driver.fail["snapshot_live"] = [SnapshotFailed("the stream broke", disk_switched=False)]
    with pytest.raises(SnapshotFailed, match="the stream broke"):
        await rt.snapshot(sbx.id)
    assert sbx.state == "running" and sbx.is_alive()
    assert (await sbx.exec(["echo", "still here"])).stdout == b"still here\n"
    assert layers() == before
    assert_holds_only(rt, sbx.id)
    # Failed after the disk moved onto the new layer: that layer is the sandbox's top now.
    driver.fail["snapshot_live"] = [SnapshotFailed("late", disk_switched=True)]
    with pytest.raises(SnapshotFailed, match="late"):
        await rt.snapshot(sbx.id)
    after = layers()
    assert after[:-1] == before and len(after) == len(before) + 1
    assert_holds_only(rt, sbx.id)
    snap = await rt.snapshot(sbx.id)  # and the next one works
    assert list(snap.info.layers) == after
    child = await rt.create(snapshot=snap.info.id)
    assert rt.describe(child.id)["layers"][:-1] == after  # type: ignore[index]
    rt.delete_snapshot(snap.info.id)


async def test_a_restarted_runtime_adopts_what_its_records_and_the_driver_vouch_for(
        config: HostConfig) -> None:
    first = new_runtime(config)
    await first.start()
    try:
        keep, sleeper, doomed = [await first.create() for _ in range(3)]
        await first.hibernate(sleeper.id)
        keep_pid = keep.pid
    finally:
        await first.close()  # the VMs keep running
    assert doomed.vm is not None
    doomed.vm.kill()  # its VMM died while no runtime ran
    state = config.sandboxes_dir
    # A directory whose record is fine, but whose "VMM" is not that VM's (the driver's
    # `owns` says no: another VM's agent socket), and one without a record.
    impostor_dir, junk = state / "sbx-0000000000aa", state / "sbx-0000000000bb"
    impostor_dir.mkdir()
    junk.mkdir()
    record = SandboxRecord.load(state / keep.id / "sandbox.json")
    replace(record, id=impostor_dir.name).save(impostor_dir / "sandbox.json")
    impostor = fake_vmm.lookalike("--workdir", str(impostor_dir), "--agent-socket",
                                  str(keep.workdir / "agent.sock"),
                                  "--disk", str(impostor_dir / "layer-0.fake"))
    second = new_runtime(config)
    try:
        report = await second.start()
        assert sorted(report.adopted) == sorted([keep.id, sleeper.id, doomed.id])
        # The dead VM's sandbox keeps its disk (ADR 0037); a VMM that is not the record's
        # VM, and a directory without a record, are no sandbox's.
        assert report.stopped == [doomed.id]
        assert set(report.cleaned) == {impostor_dir.name, junk.name}
        assert second.get(doomed.id).state == "stopped"
        await second.kill(doomed.id)
        assert impostor.wait(timeout=5) == -signal.SIGKILL
        adopted = second.get(keep.id)
        assert (adopted.pid, adopted.state) == (keep_pid, "running")
        assert (await adopted.exec(["echo", "again"])).stdout == b"again\n"
        woken = second.get(sleeper.id)
        assert woken.state == "hibernated" and woken.pid is None
        assert (await woken.exec(["echo", "awake"])).stdout == b"awake\n"
        assert woken.state == "running"
        assert_holds_only(second, keep.id, sleeper.id)
    finally:
        if impostor.poll() is None:
            impostor.kill()
            impostor.wait()
        left = await close_private_runtime(second, state, config.snapshots_dir)
    assert left == ([], []), left


async def test_a_lookup_while_a_hibernation_ends_its_vm_sees_it_hibernated(
        rt: HostRuntime) -> None:
    # Another API server's reaper reads the host's view at any moment; a running sandbox
    # without a live VM is one it stops (a fresh-clone run of the cluster tests did).
    sbx = await rt.create()
    vm = sbx.vm
    assert vm is not None
    seen: list[tuple[str, bool]] = []
    real_kill = vm.kill

    def kill_then_look(timeout: float = 5.0) -> None:
        real_kill(timeout)
        seen.append((sbx.state, sbx.is_alive()))

    vm.kill = kill_then_look  # type: ignore[method-assign]
    await rt.hibernate(sbx.id)
    assert seen == [("hibernated", False)]
    await rt.kill(sbx.id)
    assert_holds_only(rt)


def tight_memory(rt: HostRuntime, room_mb: int) -> list[int]:
    """The runtime's admission against a MemAvailable of the reserve plus `room_mb`, and
    what it had reserved at each restore of its driver (the list returned)."""
    reserve = 1000
    rt.admission = MemoryAdmission(reserve, meminfo=lambda: (24_000, reserve + room_mb))
    held: list[int] = []
    driver = driver_of(rt)
    restore = driver.restore

    async def watched(*args: object, **kwargs: object) -> object:
        held.append(rt.admission.held_mb)
        return await restore(*args, **kwargs)  # type: ignore[arg-type]

    driver.restore = watched  # type: ignore[method-assign,assignment]
    return held


async def test_memory_admission_refuses_before_anything_is_made(rt: HostRuntime) -> None:
    """Refused: nothing laid out, no VMM started; admitted: the reservation is held while
    the VM starts and given back once it is up, or when its start failed."""
    held = tight_memory(rt, room_mb=10)
    with pytest.raises(HostMemoryExhausted, match="1010 MiB available"):
        await rt.create()
    assert_holds_only(rt)
    assert held == [] and "restore" not in driver_of(rt).calls
    held = tight_memory(rt, room_mb=200)
    driver_of(rt).fail["restore"] = [VMMError("no restore today")]
    with pytest.raises(VMMError):
        await rt.create()
    assert rt.admission.held_mb == 0 and held == [VMM_FIXED_MB]  # fake: no TCG buffer
    parent = await rt.create()
    assert rt.admission.held_mb == 0 and held == [VMM_FIXED_MB] * 2
    # A fork's children start together: the second cannot pass on the first's reading.
    held = tight_memory(rt, room_mb=VMM_FIXED_MB + 8)
    with pytest.raises(HostMemoryExhausted, match="reserved by 1 VM starts under way"):
        await rt.fork(parent.id, count=2)
    assert len(held) == 1 and rt.admission.held_mb == 0
    assert_holds_only(rt, parent.id)
    await rt.hibernate(parent.id)
    tight_memory(rt, room_mb=10)
    with pytest.raises(HostMemoryExhausted, match=f"wake {parent.id}"):
        await rt.wake(parent.id)
    assert rt.get(parent.id).state == "hibernated"
    tight_memory(rt, room_mb=200)
    driver_of(rt).accel = "tcg"  # its first command's translated code comes later
    await rt.wake(parent.id)
    assert rt.admission.held_mb == TCG_START_MB
    assert (await parent.exec(["echo", "woken"])).stdout == b"woken\n"
    assert rt.admission.held_mb == 0
    idle = await rt.create()
    assert rt.admission.held_mb == TCG_START_MB  # until its first command, or its end
    await rt.kill(idle.id)
    assert rt.admission.held_mb == 0
