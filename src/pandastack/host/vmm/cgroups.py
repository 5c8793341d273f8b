"""A VM's own cgroup: CPU, memory, I/O and pids limits sized by its machine shape (ADR 0036).

Both layouts the kernel offers are handled, chosen at run time: cgroup v2 when
`/sys/fs/cgroup` is a cgroup2 mount (one tree, `cpu.max`, `memory.max`, `io.weight`,
`pids.max`), else cgroup v1 with one directory per controller hierarchy
(`cpu.cfs_quota_us`, `memory.limit_in_bytes`, `blkio.weight`, `pids.max`, and `cpuacct`
for the CPU time it used). Every VM's cgroup sits under one `pandastack` parent, named after
its work directory, so the host's gc can find those nobody uses any more.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "pandastack"
# v1 hierarchies a VM joins; cpuacct only counts (its usage is what the limit is checked by).
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "blkio", "pids")
V2_CONTROLLERS = ("cpu", "memory", "io", "pids")
CFS_PERIOD_US = 100_000
# An exited process leaves its cgroup a moment after the kill returns.
REMOVE_WAIT_S = 2.0


@dataclass(frozen=True)
class Limits:
    vcpus: int
    memory_bytes: int
    pids: int
    io_weight: int | None = None  # 1..1000 (v1 blkio: 10..1000); None: the kernel's default


def is_v2(root: Path = CGROUP_ROOT) -> bool:
    return (root / "cgroup.controllers").exists()


def cgroup_name(workdir: Path) -> str:
    """Unique per work directory (template bakes all name theirs `vm`), readable by a human."""
    digest = hashlib.sha256(str(workdir.absolute()).encode()).hexdigest()[:12]
    return f"{workdir.name}-{digest}"


def cgroup_dirs(name: str, root: Path = CGROUP_ROOT) -> list[Path]:
    if is_v2(root):
        return [root / PARENT / name]
    return [root / c / PARENT / name for c in V1_CONTROLLERS if (root / c).is_dir()]


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _enable_v2(root: Path) -> None:
    """Delegate the controllers to `pandastack/` and its children (root may refuse one the
    kernel lacks: the others still apply)."""
    parent = root / PARENT
    parent.mkdir(exist_ok=True)
    for where in (root, parent):
        have = set((where / "cgroup.controllers").read_text().split())
        for controller in V2_CONTROLLERS:
            if controller in have:
                with contextlib.suppress(OSError):
                    _write(where / "cgroup.subtree_control", f"+{controller}")


def create(name: str, limits: Limits, root: Path = CGROUP_ROOT) -> list[Path]:
    """Make the VM's cgroup with `limits`; its directories (one per v1 hierarchy)."""
    made: list[Path] = []
    try:
        if is_v2(root):
            _enable_v2(root)
            cg = root / PARENT / name
            cg.mkdir(exist_ok=True)
            made.append(cg)
            _write(cg / "cpu.max", f"{limits.vcpus * CFS_PERIOD_US} {CFS_PERIOD_US}")
            _write(cg / "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):
                _write(cg / "memory.swap.max", "0")
            _write(cg / "pids.max", str(limits.pids))
            if limits.io_weight is not None and (cg / "io.weight").exists():
                _write(cg / "io.weight", f"default {limits.io_weight}")
            return made
        for cg in cgroup_dirs(name, root):
            cg.mkdir(parents=True, exist_ok=True)
            made.append(cg)
            controller = cg.parent.parent.name
            if controller == "cpu":
                _write(cg / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                _write(cg / "cpu.cfs_quota_us", str(limits.vcpus * CFS_PERIOD_US))
            elif controller == "memory":
                _write(cg / "memory.limit_in_bytes", str(limits.memory_bytes))
            elif controller == "pids":
                _write(cg / "pids.max", str(limits.pids))
            elif controller == "blkio" and limits.io_weight is not None:
                # Only a proportional scheduler (bfq) has a weight; with none or mq-deadline
                # there is none to set, and the disks are shared as they are today.
                for weight in ("blkio.bfq.weight", "blkio.weight"):
                    if (cg / weight).exists():
                        _write(cg / weight, str(max(10, limits.io_weight)))
                        break
        return made
    except BaseException:
        for cg in made:
            with contextlib.suppress(OSError):
                cg.rmdir()
        raise


def join(dirs: list[Path], pid: int) -> None:
    """Move process `pid` (all its threads) into the cgroup."""
    for cg in dirs:
        _write(cg / "cgroup.procs", str(pid))


def remove(name: str, root: Path = CGROUP_ROOT, wait_s: float = REMOVE_WAIT_S) -> bool:
    """Remove the VM's cgroup once its processes have left (bounded wait); True if none of it
    is left."""
    deadline = time.monotonic() + wait_s
    left = [cg for cg in cgroup_dirs(name, root) if cg.exists()]
    while left:
        busy = []
        for cg in left:
            try:
                cg.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                busy.append(cg)
        left = busy
        if left:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    return True


def cpu_usage_ns(name: str, root: Path = CGROUP_ROOT) -> int:
    """CPU time the VM's processes used so far, in nanoseconds."""
    if is_v2(root):
        for line in (root / PARENT / name / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1000
        return 0
    return int((root / "cpuacct" / PARENT / name / "cpuacct.usage").read_text())


def procs(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def stale(root: Path = CGROUP_ROOT, grace_s: float = 60.0,
          now: Callable[[], float] = time.time) -> list[str]:
    """Names of VM cgroups with no process in any hierarchy, made more than `grace_s` ago (a
    younger empty one may be a VM's whose VMM is just starting)."""
    parents = ([root / PARENT] if is_v2(root)
               else [root / c / PARENT for c in V1_CONTROLLERS])
    names: set[str] = set()
    busy: set[str] = set()
    for parent in parents:
        try:
            children = [p for p in parent.iterdir() if p.is_dir()]
        except FileNotFoundError:
            continue
        for cg in children:
            try:
                young = now() - cg.stat().st_mtime < grace_s
            except FileNotFoundError:
                continue
            if young or procs(cg):
                busy.add(cg.name)
            else:
                names.add(cg.name)
    return sorted(names - busy)


def pid_cgroup(pid: int) -> str:
    """/proc/PID/cgroup, as the kernel writes it."""
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


def remove_stale(progress: Callable[[str], None], root: Path = CGROUP_ROOT,
                 grace_s: float = 60.0) -> list[str]:
    removed = []
    for name in stale(root, grace_s):
        with contextlib.suppress(OSError):
            if remove(name, root, wait_s=0):
                removed.append(name)
    if removed:
        progress(f"removed {len(removed)} VM cgroup(s) nobody uses")
    return removed


def available(root: Path = CGROUP_ROOT) -> bool:
    """Whether this host can give VMs cgroups (mounted and writable by us)."""
    if is_v2(root):
        return os.access(root, os.W_OK)
    return all(os.access(root / c, os.W_OK) for c in ("cpu", "memory", "pids"))
