"""Staging template memory on tmpfs: a faithful sparse copy, made once, redone when the
durable file changes, and removed when it goes. No VM needed (files only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pandastack.host.memory import stage as stage_module
from pandastack.host.memory.stage import restaged, stage, staged_path, sweep

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


def _aged(path: Path, seconds: float) -> None:
    """Marks a staged copy last used `seconds` ago (its atime; the mtime stays)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns - int(seconds * 1e9), st.st_mtime_ns))


def test_the_stage_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    """Each template version restored used to keep its whole copy for good (every image a
    team builds FROM is one) until tmpfs filled the host's memory: the stage's budget
    removes what no VMM names and nobody used lately, oldest first, and restaged copies a
    removed one back."""
    root = tmp_path / "stage"
    versions = [tmp_path / "home" / "templates" / f"oci-{n}" / "k" / "memory" for n in range(4)]
    for durable in versions:
        _memory_file(durable, 8 * MIB)
    budget = 20 * MIB  # two 8 MiB copies fit, a third does not
    first, second = (stage(d, root, budget) for d in versions[:2])
    assert first.is_relative_to(root) and second.is_relative_to(root)
    # Both in use now (recently staged): no room is made, the durable file is used instead.
    assert stage(versions[2], root, budget) == versions[2]
    _aged(first, 2 * stage_module.RECENT_S)
    _aged(second, 3 * stage_module.RECENT_S)  # the least recently used
    third = stage(versions[2], root, budget)
    assert third.is_relative_to(root)
    assert not second.exists() and first.exists()
    # One a VMM's command line names stays however old it is.
    _aged(first, 4 * stage_module.RECENT_S)
    _aged(third, 2 * stage_module.RECENT_S)
    named = {str(first)}
    assert stage_module.make_room(root, 8 * MIB, budget, tmp_path / "none",
                                  in_use=lambda _root: named)
    assert first.exists() and not third.exists()
    # A runtime that loaded the second version before its copy went gets it back.
    again = restaged(second, root, budget + 8 * MIB)
    assert again == second and again.read_bytes() == versions[1].read_bytes()
    assert restaged(versions[3], root, budget) == versions[3]  # not a staged path: itself
