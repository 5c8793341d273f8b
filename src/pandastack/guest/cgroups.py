"""cgroup v2 leaves for process trees (guest mode only).

Each exec/spawn gets a leaf ``/sys/fs/cgroup/pandastack/p<N>`` of its own. The child is
put there without a preexec_fn: under a lock the agent moves itself into the leaf, spawns
(the child inherits the cgroup) and moves itself back.

A leaf whose process tree has ended is kept for the next exec instead of removed: creating a
cgroup (its controllers' state and interface files) and removing it again is most of the
kernel work of a short exec. The template's warm-up leaves its emptied leaves behind, so a
clone's first exec finds one ready.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("pandastack_guest")

CGROUP_ROOT = "/sys/fs/cgroup"
# User processes (everything under `pandastack/`) may not take the whole guest: a fork bomb
# or a memory hog hits these limits and is killed inside its cgroup, while the agent, which
# stays outside, keeps answering.
USER_PIDS_MAX = 2048
AGENT_RESERVE_BYTES = 64 << 20
SPARE_LEAVES_MAX = 8


def _is_cgroup2_mounted(root: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] == root and parts[2] == "cgroup2":
                    return True
    except OSError:
        pass
    return False


def _mount_cgroup2(root: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    os.makedirs(root, exist_ok=True)
    if libc.mount(b"cgroup2", root.encode(), b"cgroup2", 0, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), root)


def _mem_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def _write(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


class Cgroups:
    """Creates, fills, kills and removes per-process-tree cgroup leaves."""

    def __init__(self, root: str = CGROUP_ROOT) -> None:
        self.root = root
        self.base = os.path.join(root, "pandastack")
        self._lock = threading.Lock()
        self._n = 0
        self._home = root
        self._stale: list[str] = []
        self._spare: list[str] = []  # empty leaves, ready for the next spawn

    @classmethod
    def setup(cls, root: str = CGROUP_ROOT) -> Cgroups | None:
        """Mount cgroup2 if needed and create the base; None if cgroups are unusable."""
        cg = cls(root)
        try:
            if not _is_cgroup2_mounted(root):
                _mount_cgroup2(root)
            os.makedirs(cg.base, exist_ok=True)
            cg._limit_user_processes()
            with open("/proc/self/cgroup") as f:
                for line in f:
                    if line.startswith("0::"):
                        cg._home = os.path.join(root, line[3:].strip().lstrip("/"))
        except OSError as e:
            log.warning("cgroups unavailable, using process groups only: %s", e)
            return None
        return cg

    def _limit_user_processes(self) -> None:
        try:
            _write(os.path.join(self.root, "cgroup.subtree_control"), "+pids +memory")
            _write(os.path.join(self.base, "pids.max"), str(USER_PIDS_MAX))
            total = _mem_total_bytes()
            limit = max(total - AGENT_RESERVE_BYTES, total // 2)
            _write(os.path.join(self.base, "memory.max"), str(limit))
        except OSError as e:
            log.warning("cannot limit user processes: %s", e)

    def spawn_in_leaf(self, spawn: Callable[[], T]) -> tuple[T, str | None]:
        """Run ``spawn`` with the agent in an empty leaf (spare or new); return (result, leaf)."""
        with self._lock:
            spare = self._spare.pop() if self._spare else None
            if spare is None:
                self._n += 1
            leaf = spare or os.path.join(self.base, f"p{self._n}")
            try:
                if spare is None:
                    os.mkdir(leaf)
                _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
            except OSError as e:
                log.warning("cgroup leaf %s: %s", leaf, e)
                self._rmdir(leaf)
                return spawn(), None
            try:
                return spawn(), leaf
            finally:
                try:
                    _write(os.path.join(self._home, "cgroup.procs"), str(os.getpid()))
                except OSError as e:
                    log.error("moving agent back to %s: %s", self._home, e)

    def kill(self, leaf: str) -> None:
        try:
            _write(os.path.join(leaf, "cgroup.kill"), "1")
        except OSError as e:
            if e.errno != errno.ENOENT:
                log.warning("cgroup.kill %s: %s", leaf, e)

    def _rmdir(self, leaf: str) -> bool:
        try:
            os.rmdir(leaf)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def release(self, leaf: str) -> None:
        """Keep the leaf for reuse (or remove it) once it is empty; retry on later calls."""
        with self._lock:
            stale = [p for p in self._stale if not self._reclaim(p)]
            if not self._reclaim(leaf):
                stale.append(leaf)
            self._stale = stale[-1024:]

    def _reclaim(self, leaf: str) -> bool:
        """True if the leaf is empty and now spare or removed; False if processes remain."""
        if len(self._spare) >= SPARE_LEAVES_MAX:
            return self._rmdir(leaf)
        try:
            with open(os.path.join(leaf, "cgroup.events")) as f:
                populated = "populated 1" in f.read()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if not populated:
            self._spare.append(leaf)
        return not populated
