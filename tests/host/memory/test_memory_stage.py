"""Staging template memory on tmpfs: a faithful sparse copy, made once, redone when the
durable file changes, and removed when it goes. No VM needed (files only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pandastack.host.memory.stage import stage, staged_path, sweep

MIB = 1 << 20


def _memory_file(path: Path, size: int = 64 * MIB) -> bytes:
    """A sparse file with data at a few places, as a template's RAM looks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, fill in ((0, b"a"), (5 * MIB + 123, b"b"), (size - 4096, b"c")):
            f.seek(offset)
            f.write(fill * 4096)
    return path.read_bytes()


def test_stage_copies_content_and_allocates_the_whole_file(tmp_path: Path) -> None:
    durable = tmp_path / "home" / "templates" / "base" / "k1" / "memory"
    content = _memory_file(durable)
    root = tmp_path / "stage"
    staged = stage(durable, root)
    assert staged == staged_path(durable, root)
    assert str(durable.parent) in str(staged)  # template GC finds the version in cmdlines
    assert staged.read_bytes() == content
    assert staged.stat().st_size == durable.stat().st_size
    # Allocated whole: no page is allocated later, while a guest runs (SIGBUS if tmpfs is full).
    assert staged.stat().st_blocks * 512 >= staged.stat().st_size
    assert staged.stat().st_mtime_ns == durable.stat().st_mtime_ns


def test_stage_copies_once_and_again_when_the_durable_file_changes(tmp_path: Path) -> None:
    durable = tmp_path / "memory"
    _memory_file(durable)
    root = tmp_path / "stage"
    first = stage(durable, root).stat().st_ino
    assert stage(durable, root).stat().st_ino == first
    with open(durable, "r+b") as f:
        f.write(b"new!")
    os.utime(durable, ns=(0, durable.stat().st_mtime_ns + 1_000_000))
    again = stage(durable, root)
    assert again.stat().st_ino != first
    assert again.read_bytes()[:4] == b"new!"


def test_stage_falls_back_to_the_durable_file(tmp_path: Path) -> None:
    durable = tmp_path / "memory"
    _memory_file(durable, MIB)
    assert stage(durable, None) == durable
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(tiny)],
                      capture_output=True).returncode == 0:
        try:  # no room for the whole file: the durable one, and nothing half made left
            assert stage(durable, tiny) == durable
            assert [p for p in tiny.rglob("*") if p.is_file()] == []
        finally:
            subprocess.run(["umount", str(tiny)], check=True)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the stage root should be")
    assert stage(durable, blocked) == durable
    assert stage(tmp_path / "missing", tmp_path / "stage") == tmp_path / "missing"


@pytest.mark.parametrize("dead_pid", [2**22 + 17])
def test_sweep_removes_what_no_durable_file_backs(tmp_path: Path, dead_pid: int) -> None:
    root = tmp_path / "stage"
    kept, gone, changed = (tmp_path / name / "memory" for name in ("kept", "gone", "changed"))
    for durable in (kept, gone, changed):
        _memory_file(durable, MIB)
        stage(durable, root)
    gone.unlink()
    os.utime(changed, ns=(0, 12345))
    abandoned = staged_path(kept, root).with_name(f".memory.{dead_pid}.partial")
    abandoned.write_bytes(b"half")
    in_progress = staged_path(kept, root).with_name(f".memory.{os.getpid()}.partial")
    in_progress.write_bytes(b"being copied")
    removed = sweep(root, progress=lambda _: None)
    assert set(removed) == {staged_path(gone, root), staged_path(changed, root), abandoned}
    assert staged_path(kept, root).exists() and in_progress.exists()
    assert not staged_path(gone, root).parent.exists()  # emptied directories go too
    assert sweep(None) == [] and sweep(tmp_path / "nothing") == []
