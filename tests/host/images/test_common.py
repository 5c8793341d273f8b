"""Leftovers of interrupted image builds (host/images/common.py)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from pandastack.host.images.common import sweep_when_idle
from pandastack.host.images.rootfs import run_with_bind_mount


def _leftover(parent: Path) -> Path:
    tmp = parent / ".tmp-rootfs-killed"
    (tmp / "root").mkdir(parents=True)
    (tmp / "root" / "file").write_bytes(b"x")
    return tmp


def test_a_killed_builds_leftover_goes_when_no_build_holds_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    lock.touch()
    images = tmp_path / "images"
    kept = images / "0123abcd"
    kept.mkdir(parents=True)
    tmp = _leftover(images)
    assert sweep_when_idle(lock, [images, tmp_path / "missing"])
    assert not tmp.exists()
    assert kept.is_dir()


def test_a_running_builds_directory_is_left_alone(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    lock.touch()
    tmp = _leftover(tmp_path)
    fd = os.open(lock, os.O_RDWR)  # another open file: flock conflicts as another process's
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert not sweep_when_idle(lock, [tmp_path])
        assert tmp.is_dir()
    finally:
        os.close(fd)


def test_no_lock_file_means_no_build_ever_ran_here(tmp_path: Path) -> None:
    tmp = _leftover(tmp_path)
    assert not sweep_when_idle(tmp_path / ".lock", [tmp_path])
    assert tmp.is_dir()


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mounts", encoding="utf-8") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(path))]


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_a_bind_mount_for_a_build_step_stays_in_its_own_namespace(tmp_path: Path) -> None:
    source, target = tmp_path / "cache", tmp_path / "root" / "cache"
    source.mkdir()
    target.mkdir(parents=True)
    (source / "wheel").write_bytes(b"w")
    out = tmp_path / "seen"
    run_with_bind_mount(source, target, ["sh", "-c", f"ls {target} > {out}"], what="ls")
    assert out.read_text().split() == ["wheel"]
    assert not _mounts_under(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_a_build_steps_procfs_stays_in_its_own_namespace(tmp_path: Path) -> None:
    """npm's install scripts (and Bun) need /proc in the chroot: mounted with the cache, it
    goes with the step's namespace too."""
    source, target, proc = tmp_path / "cache", tmp_path / "root" / "cache", tmp_path / "proc"
    for d in (source, target, proc):
        d.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "seen"
    run_with_bind_mount(source, target, ["sh", "-c", f"readlink {proc}/self/exe > {out}"],
                        what="readlink", proc=proc)
    assert out.read_text().strip().endswith("readlink")
    assert not _mounts_under(tmp_path)
    assert not list(proc.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_a_mount_a_killed_build_left_is_detached_before_its_leftover_goes(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    lock.touch()
    tmp = _leftover(tmp_path)
    held = tmp / "root" / "var" / "cache"
    held.mkdir(parents=True)
    source = tmp_path / "pip"
    source.mkdir()
    (source / "wheel").write_bytes(b"w")
    subprocess.run(["mount", "--bind", str(source), str(held)], check=True)
    try:
        assert sweep_when_idle(lock, [tmp_path])
        assert not tmp.exists()
        # Detached first: removing the tree through the mount would empty the host's cache.
        assert (source / "wheel").read_bytes() == b"w"
    finally:
        if _mounts_under(held):
            subprocess.run(["umount", "-l", str(held)], check=False)
