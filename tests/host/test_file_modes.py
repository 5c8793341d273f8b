"""What the runtime writes on the host is private to the service: directories 0700, files
(and sockets) without group or other bits, also what QEMU creates and what an older install
left open; guest image builds keep the modes the guest needs."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.host.config import FORK_BUFFERS_ROOT, HUGETLB_CLAIMS_ROOT, HostConfig
from pandastack.host.file_modes import make_private, make_private_dir
from pandastack.host.images.common import run
from pandastack.host.images.rootfs import _guest_dirs
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.records import HIBERNATION
from pandastack.hostport.errors import SetupError
from tests.helpers import close_private_runtime
from tests.leftovers import owned_tmpdir


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The umask of a process that did not choose one (the runtime sets its own)."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_to_others(*tops: Path) -> list[str]:
    """Every path under `tops` (themselves included) with a group or other bit."""
    found = []
    for top in tops:
        for root, dirs, files in os.walk(top):
            for path in [Path(root), *(Path(root) / n for n in dirs + files)]:
                if not path.is_symlink() and mode(path) & 0o077:
                    found.append(f"{path} {mode(path):o}")
    return sorted(set(found))


def test_an_older_installs_open_directories_are_made_private(
        tmp_path: Path, open_umask: None) -> None:
    home = tmp_path / "home"
    (home / "templates" / "base").mkdir(parents=True, mode=0o755)
    os.chmod(home, 0o755)
    db = home / "pandastack.db"
    db.write_bytes(b"")
    os.chmod(db, 0o644)
    readonly = home / "templates" / "base" / "memory.raw"
    readonly.write_bytes(b"")
    os.chmod(readonly, 0o444)
    building = home / "cache" / ".tmp-rootfs-x" / "root" / "usr"
    building.mkdir(parents=True)
    os.chmod(building, 0o755)  # a guest tree being built: its modes are the guest's
    stage = tmp_path / "stage"
    stage.mkdir(mode=0o755)
    make_private(HostConfig(home=home, memory_stage_dir=stage, state_dir=tmp_path / "state",
                            snapshots_root=tmp_path / "snaps"))
    assert os.umask(0o022) == 0o077
    for directory in (home, stage, home / "templates", FORK_BUFFERS_ROOT, HUGETLB_CLAIMS_ROOT):
        assert not directory.exists() or mode(directory) == 0o700, directory
    assert not (tmp_path / "snaps").exists()  # made when first needed, under the umask
    assert mode(db) == 0o600
    assert mode(readonly) == 0o400
    assert mode(building) == 0o755


def test_a_shared_directory_is_refused_not_closed(open_umask: None) -> None:
    shared = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(shared, 0o1777)
        with pytest.raises(SetupError, match="shared directory"):
            make_private_dir(shared)
        assert mode(shared) == 0o1777
        with pytest.raises(SetupError, match="shared directory"):
            make_private_dir(Path("/dev/shm"))
        # A tmpfs of its own is 1777 when fresh, and is not shared.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(shared)],
                       check=True)
        try:
            make_private_dir(shared)
            assert mode(shared) == 0o700
        finally:
            subprocess.run(["umount", str(shared)], check=True)
    finally:
        shutil.rmtree(shared)


def test_image_builds_keep_the_guests_modes_under_the_services_umask(tmp_path: Path) -> None:
    before = os.umask(0o077)
    try:
        assert run(["sh", "-c", "umask"]).strip() == "0022"
        _guest_dirs(tmp_path / "opt" / "pandastack" / "agent")
        assert [mode(tmp_path / p) for p in ("opt", "opt/pandastack", "opt/pandastack/agent")] \
            == [0o755] * 3
    finally:
        os.umask(before)


@pytest.mark.vm
async def test_a_sandbox_and_its_snapshot_leave_only_private_files(
        host_config: HostConfig, open_umask: None) -> None:
    state = owned_tmpdir("psfm-")
    snaps = owned_tmpdir("psfm-snap-")
    stage = owned_tmpdir("psfm-stage-", "/dev/shm")
    for directory in (state, snaps, stage):
        os.chmod(directory, 0o755)  # as an older install made them
    left_open = snaps / "from-an-older-install.json"
    left_open.write_text("{}")
    os.chmod(left_open, 0o644)
    config = HostConfig.from_env(state_dir=state, snapshots_root=snaps, memory_stage_dir=stage)
    rt = HostRuntime(config)
    try:
        await rt.start()
        sbx = await rt.create()
        assert (await sbx.exec("echo secret > /work/s; sync")).exit_code == 0
        snap = await rt.snapshot(sbx.id)
        child = await rt.create(snapshot=snap.info.id)
        await rt.hibernate(child.id)
        workdir, child_dir = state / sbx.id, state / child.id
        # Sockets: the agent's, and what else the VMM makes (QEMU: its QMP socket).
        made = [workdir / "console.log", workdir / "vmm.log", *workdir.glob("*.sock"),
                workdir / "sandbox.json", child_dir / HIBERNATION,
                *workdir.glob(f"layer-*{rt.driver.disks.suffix}"),
                snaps / snap.info.id / "state.stream", snaps / snap.info.id / "snapshot.json",
                *stage.rglob("memory")]
        assert len(made) >= 10 and all(p.exists() for p in made), made
        assert workdir / "agent.sock" in made
        assert open_to_others(state, snaps, stage) == []
        assert all(mode(d) == 0o700 for d in (state, snaps, stage, workdir, child_dir,
                                              snaps / snap.info.id)), \
            [f"{d} {mode(d):o}" for d in (state, snaps, stage, workdir, snaps / snap.info.id)]
        assert stat.S_ISSOCK(os.lstat(workdir / "agent.sock").st_mode)
        assert mode(config.home) == 0o700
        await rt.wake(child.id)
        assert (await child.exec("cat /work/s")).stdout == b"secret\n"
        assert open_to_others(state, snaps, stage) == []
        rt.delete_snapshot(snap.info.id)
        left_open.unlink()
    finally:
        leftovers = await close_private_runtime(rt, state, snaps)
        shutil.rmtree(stage, ignore_errors=True)
    assert leftovers == ([], [])
