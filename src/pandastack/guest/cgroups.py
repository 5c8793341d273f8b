"""cgroup v2 leaves for process trees (guest mode only).

Each exec/spawn gets a leaf ``/sys/fs/cgroup/pandastack/p<N>`` of its own. The child is
put there without a preexec_fn: under a lock the agent moves itself into the leaf, spawns
(the child inherits the cgroup) and moves itself back.

A leaf whose process tree has ended is kept for the next exec instead of removed: creating a
cgroup (its controllers' state and interface files) and removing it again is most of the
kernel work of a short exec. The template's warm-up leaves its emptied leaves behind, so a
clone's first exec finds one ready.

The agent must keep answering while user processes thrash (a fork bomb on the guest's one
vCPU, under TCG): it lives in ``/sys/fs/cgroup/agent`` (the init script puts it there before
Python starts, so the pages it loads are charged there), which outweighs the user subtree
for CPU and whose memory is reclaimed last; and the user subtree's process count is
capped low enough that the kernel memory of its tasks cannot exhaust the guest, so the
kernel's own OOM killer (which would pick the agent, the largest process) is not reached.
The agent's oom_score_adj is left alone: its children inherit it, and giving each one its
own back costs a clone's first exec ~10 ms under TCG (a procfs write path to translate).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("pandastack_guest")

CGROUP_ROOT = "/sys/fs/cgroup"
AGENT_CGROUP = "agent"
# User processes (everything under `pandastack/`) may not take the whole guest: a fork bomb
# or a memory hog hits these limits and is killed inside its cgroup, while the agent, which
# stays outside, keeps answering. Each task also holds kernel memory that no cgroup is
# charged for: at 2048 tasks a bash fork bomb exhausted a 512 MiB guest's memory and the
# kernel's OOM killer took the agent.
USER_PIDS_MAX = 1024
# One process tree (one exec or spawn) may not take them all: another exec can still start
# while a fork bomb holds its leaf's limit.
LEAF_PIDS_MAX = USER_PIDS_MAX - 128
AGENT_RESERVE_BYTES = 64 << 20
# Kept free beyond what the guest had left when the agent started: the agent's own growth,
# page tables and kernel memory of up to USER_PIDS_MAX tasks, the kernel's free watermarks.
# With only AGENT_RESERVE_BYTES, 35 user processes of 11 MiB each ran a 512 MiB guest out of
# memory (not their cgroup) and the kernel killed the agent.
LATER_RESERVE_BYTES = 32 << 20
# A busy agent outweighs the whole user subtree (default weight 100) a hundred to one.
AGENT_CPU_WEIGHT = 10000
# Memory of the agent's cgroup (its Python, its libraries, its heap) that reclaim takes last:
# memory.low, not memory.min, so that the kernel, if it must, evicts the agent's pages
# rather than run out of memory (its OOM killer would take the agent, the largest process).
AGENT_MEMORY_LOW = 32 << 20
SPARE_LEAVES_MAX = 8
EMPTY_POLL_SECONDS = 0.02


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
    # favordynmods as the init script mounts it (kernels before 6.0 refuse it: then without).
    if (libc.mount(b"cgroup2", root.encode(), b"cgroup2", 0, b"favordynmods") != 0
            and libc.mount(b"cgroup2", root.encode(), b"cgroup2", 0, None) != 0):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), root)


def _meminfo_bytes(*names: str) -> list[int]:
    found: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in names:
                found[name] = int(rest.split()[0]) * 1024
    if len(found) != len(names):
        raise OSError(f"no {', '.join(n for n in names if n not in found)} in /proc/meminfo")
    return [found[n] for n in names]


def user_memory_limit(total: int, available: int) -> int:
    """memory.max of the user subtree: what the guest can still give when the agent starts
    (at boot: the kernel and the agent took the rest), less what the agent and the kernel
    need later, so the user processes meet their cgroup's OOM killer before the kernel runs
    out (whose OOM killer takes the largest process: the agent)."""
    return max(min(total - AGENT_RESERVE_BYTES, available - LATER_RESERVE_BYTES), total // 2)


def _own_cgroup(root: str) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return os.path.join(root, line[3:].strip().lstrip("/"))
    return root


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
            cg._protect_agent()
            cg._home = _own_cgroup(root)
        except OSError as e:
            log.warning("cgroups unavailable, using process groups only: %s", e)
            return None
        return cg

    def _limit_user_processes(self) -> None:
        try:
            _write(os.path.join(self.root, "cgroup.subtree_control"), "+pids +memory +cpu")
            _write(os.path.join(self.base, "pids.max"), str(USER_PIDS_MAX))
            total, available = _meminfo_bytes("MemTotal", "MemAvailable")
            _write(os.path.join(self.base, "memory.max"),
                   str(user_memory_limit(total, available)))
            # Each leaf its own CPU share and process limit: a bomb in one exec does not starve
            # the others (nor the agent while it spawns in a leaf of its own).
            _write(os.path.join(self.base, "cgroup.subtree_control"), "+cpu +pids")
        except OSError as e:
            log.warning("cannot limit user processes: %s", e)

    def _protect_agent(self) -> None:
        """CPU weight and memory protection of the agent's own cgroup."""
        agent = os.path.join(self.root, AGENT_CGROUP)
        try:
            os.makedirs(agent, exist_ok=True)
            if _own_cgroup(self.root) != agent:  # started by hand, not by the init script
                _write(os.path.join(agent, "cgroup.procs"), str(os.getpid()))
            _write(os.path.join(agent, "cpu.weight"), str(AGENT_CPU_WEIGHT))
            _write(os.path.join(agent, "memory.low"), str(AGENT_MEMORY_LOW))
        except OSError as e:
            log.warning("cannot protect the agent from user processes: %s", e)

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
                    self._limit_leaf(leaf)
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

    def _limit_leaf(self, leaf: str) -> None:
        # No such file: setup could not give the leaves a pids controller.
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(leaf, "pids.max"), str(LEAF_PIDS_MAX))

    def kill(self, leaf: str) -> None:
        try:
            _write(os.path.join(leaf, "cgroup.kill"), "1")
        except OSError as e:
            if e.errno != errno.ENOENT:
                log.warning("cgroup.kill %s: %s", leaf, e)

    def wait_empty(self, leaf: str, deadline: float) -> bool:
        """Wait (until the monotonic ``deadline``) for a killed leaf to hold no task, not even
        a zombie (a zombie's pid still counts towards the limits). True if it is empty."""
        while True:
            try:
                with open(os.path.join(leaf, "pids.current")) as f:
                    if int(f.read()) == 0:
                        return True
            except (OSError, ValueError):
                return True  # no pids controller here: the caller's pipes were all it had
            if time.monotonic() >= deadline:
                return False
            time.sleep(EMPTY_POLL_SECONDS)

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
