"""Template memory files staged on tmpfs, so that snapshots need not stop the guest.

Every clone maps its template's memory file privately. The kernel lets userfaultfd
write-protect such a mapping only when the file is on tmpfs (shmem) or the memory is
anonymous; QEMU's background snapshot needs exactly that (it write-protects guest RAM, lets
the guest run and saves each page before its first write). Under TCG on QEMU < 9.0 that is
the only way to snapshot a running guest correctly without stopping it for the whole save
(ADR 0003, ADR 0008).

The durable copy stays under PANDASTACK_HOME (tmpfs is empty after a reboot). The staged
copy mirrors the durable file's real path (symlinks resolved) below the stage root, so the
template version's directory still appears in every VMM command line: template GC decides
"in use" by that path. Real, not as given: runtimes whose homes reach one template cache
through symlinks (the agents of `make cluster`, ADR 0021) stage one copy, not one each.

The stage is bounded (PANDASTACK_MEMORY_STAGE_MB, default a quarter of the host's memory):
each copy is allocated whole, and one per template version ever restored (every image a
team builds FROM is one) filled tmpfs until the kernel's OOM killer ran. To make room for a
copy, the least recently used copies go that no VMM's command line names and that nobody
staged or restored from in the last RECENT_S; where no room can be made the durable file is
used (snapshots then stop the guest). A runtime restores through `restaged`, which copies
an evicted file back.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from pandastack.host.sparse import data_ranges
from pandastack.host.vmm.driver import iter_cmdlines, pid_is_running

CHUNK = 1 << 20
# A copy staged or restored from this recently is kept: its VMM may be about to start.
RECENT_S = 300.0
_ZERO = bytes(CHUNK)


def staged_path(durable: Path, root: Path) -> Path:
    return root / durable.resolve().relative_to("/")


def _fresh(staged: Path, durable: os.stat_result) -> bool:
    try:
        st = staged.stat()
    except FileNotFoundError:
        return False
    return st.st_size == durable.st_size and st.st_mtime_ns == durable.st_mtime_ns


def _copy(src: Path, dst: Path, size: int) -> None:
    """Copy the data of `src` (skipping its holes and zero chunks), then allocate the rest.

    Allocated up front on purpose: a clone reading never-touched RAM, or QEMU pre-faulting it
    for a background snapshot, would otherwise allocate tmpfs pages in the middle of running
    the guest, and a full tmpfs would then kill the VMM with SIGBUS."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for data_at, hole_at in data_ranges(fin.fileno(), size):
            fin.seek(data_at)
            position = data_at
            while position < hole_at:
                chunk = fin.read(min(CHUNK, hole_at - position))
                if not chunk:
                    break
                if chunk != _ZERO[:len(chunk)]:
                    os.pwrite(fout.fileno(), chunk, position)
                position += len(chunk)
        fout.truncate(size)
        os.posix_fallocate(fout.fileno(), 0, size)


def default_budget() -> int:
    """A quarter of the host's memory, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 // 4
    return 4 << 30


def _used(path: Path, durable: os.stat_result) -> None:
    """Marks the copy used now (its atime; the mtime is the durable file's, which _fresh
    compares)."""
    with contextlib.suppress(OSError):
        os.utime(path, ns=(time.time_ns(), durable.st_mtime_ns))


def _in_use(root: Path) -> set[str]:
    """Staged files some VMM's command line names."""
    prefix = str(root) + "/"
    named: set[str] = set()
    for _pid, argv in iter_cmdlines():
        for arg in argv:
            for part in arg.split(","):
                if part.startswith("mem-path=" + prefix):
                    named.add(part.removeprefix("mem-path="))
    return named


def make_room(root: Path, need: int, budget: int, keep: Path,
              in_use: Callable[[Path], set[str]] = _in_use) -> bool:
    """Removes least recently used copies (not `keep`, not named by a VMM, not used in the
    last RECENT_S) until `need` more bytes fit in `budget`; whether they do."""
    copies = []
    for path in root.rglob("*"):
        if path.is_file() and not path.name.endswith(".partial") and path != keep:
            with contextlib.suppress(FileNotFoundError):
                copies.append((path, path.stat()))
    used = sum(st.st_blocks * 512 for _p, st in copies)
    if used + need <= budget:
        return True
    named = in_use(root)
    recent = time.time_ns() - int(RECENT_S * 1e9)
    for path, st in sorted(copies, key=lambda c: c[1].st_atime_ns):
        if str(path) in named or st.st_atime_ns > recent:
            continue
        path.unlink(missing_ok=True)  # a VMM mapping it keeps its pages until it exits
        used -= st.st_blocks * 512
        if used + need <= budget:
            return True
    return False


def stage(durable: Path, root: Path | None, budget: int | None = None) -> Path:
    """The staged copy of the memory file `durable`, copied now if missing or stale.

    Falls back to `durable` itself (and snapshots to stopping the guest) when staging is off
    (`root` is None) or impossible: tmpfs has no room for the whole file, or the stage's
    `budget` (bytes; None: default_budget()) cannot make room for it."""
    if root is None:
        return durable
    target = staged_path(durable, root)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        source = durable.stat()
        if _fresh(target, source):
            _used(target, source)
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        if not make_room(root, source.st_size, default_budget() if budget is None else budget,
                         target):
            return durable
        _copy(durable, partial, source.st_size)
        os.utime(partial, ns=(time.time_ns(), source.st_mtime_ns))
        os.replace(partial, target)
        return target
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return durable


def restaged(memory: Path, root: Path | None, budget: int | None = None) -> Path:
    """The memory file to restore from: a staged copy is marked used, or copied again if
    make_room removed it since the template was loaded; any other file is itself."""
    if root is None or not memory.is_relative_to(root):
        return memory
    return stage(Path("/") / memory.relative_to(root), root, budget)


def sweep(root: Path | None, progress: Callable[[str], None] = print) -> list[Path]:
    """Remove staged copies whose durable file is gone or changed, and copies abandoned half
    made by a dead process. A VMM that still maps a removed copy keeps its pages until it
    exits (the inode lives on), so this is safe while sandboxes run."""
    if root is None or not root.is_dir():
        return []
    removed: list[Path] = []
    for staged in sorted(root.rglob("*")):
        if not staged.is_file():
            continue
        if staged.name.endswith(".partial"):
            pid = staged.name.rsplit(".", 2)[-2]
            stale = not (pid.isdigit() and pid_is_running(int(pid)))
        else:
            durable = Path("/") / staged.relative_to(root)
            try:
                stale = not _fresh(staged, durable.stat())
            except FileNotFoundError:
                stale = True
        if stale:
            staged.unlink(missing_ok=True)
            removed.append(staged)
    for directory in sorted((d for d in root.rglob("*") if d.is_dir()), reverse=True):
        with contextlib.suppress(OSError):  # only succeeds when empty
            directory.rmdir()
    if removed:
        progress(f"removed {len(removed)} stale staged memory file(s)")
    return removed
