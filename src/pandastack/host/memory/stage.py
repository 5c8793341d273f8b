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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from pandastack.host.sparse import data_ranges
from pandastack.host.vmm.driver import pid_is_running

CHUNK = 1 << 20
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


def stage(durable: Path, root: Path | None) -> Path:
    """The staged copy of the memory file `durable`, copied now if missing or stale.

    Falls back to `durable` itself (and snapshots to stopping the guest) when staging is off
    (`root` is None) or impossible, e.g. tmpfs has no room for the whole file."""
    if root is None:
        return durable
    target = staged_path(durable, root)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        source = durable.stat()
        if _fresh(target, source):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy(durable, partial, source.st_size)
        os.utime(partial, ns=(source.st_atime_ns, source.st_mtime_ns))
        os.replace(partial, target)
        return target
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return durable


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
