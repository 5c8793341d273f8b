"""Garbage collection of template versions and guest images nobody uses any more, and of VMM
processes nobody owns.

Every change to the guest agent or image recipe produces a new image (~300 MB) and new
template snapshots (memory file, disk layer). Old versions are removed once no running VMM
process refers to them and they have not been touched for a grace period (a create that has
picked a template but not yet started its VM must not lose it). A process that has loaded a
version also holds a shared lock on its `template.json` for as long as it lives: runtimes
whose VMs the command lines no longer name it for (a jailed VMM gets its files by descriptor),
or that have no VM from it running right now, keep it all the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pandastack.host.vmm import cgroups
from pandastack.host.vmm.driver import iter_cmdlines, pid_is_running, read_cmdline
from pandastack.host.vmm.factory import is_vmm_process, vm_workdir
from pandastack.host.vmm.qemu.jail import JAIL_DIR

GRACE_S = 600.0
# template version directory -> the descriptor this process holds a shared lock through
_HELD: dict[str, int] = {}


def hold_version(version: Path) -> bool:
    """Mark the template version `version` used by this process until it exits; False if it
    was removed before the lock was had (its files are then not to be used)."""
    key = str(version.resolve())
    if key in _HELD:
        return True
    try:
        fd = os.open(version / "template.json", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a pruner is removing it
    if not (version / "template.json").exists():
        os.close(fd)
        return False
    _HELD[key] = fd
    # Used now: the grace then also covers a moment with no holder, such as a server's
    # restart between its old process and the new one's holds.
    with contextlib.suppress(OSError):
        os.utime(version)
    return True


def _held_elsewhere(version: Path) -> int | None:
    """None if some process holds `version`; else a descriptor holding it exclusively, kept
    while it is removed so that nobody starts to use it half way."""
    try:
        fd = os.open(version / "template.json", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1  # a version with no metadata was never whole: nobody can have loaded it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _vmm_cmdlines() -> list[str]:
    """Each VMM's command line, and again with every path in it resolved: a runtime whose
    home reaches the shared templates through a symlink names them by another path."""
    lines = []
    for _, argv in iter_cmdlines():
        if is_vmm_process(argv):
            line = "\0".join(argv)
            paths = (os.path.realpath(p) for p in _PATH.findall(line))
            lines.append(line + "\0" + "\0".join(paths))
    return lines


_PATH = re.compile(r"/[^\0,=:]+")


def _old(path: Path, now: float, grace: float) -> bool:
    try:
        return now - path.stat().st_mtime > grace
    except FileNotFoundError:
        return False


def prune_templates(templates_dir: Path, keep: Iterable[Path], *, grace: float = GRACE_S,
                    names: Iterable[str] | None = None,
                    progress: Callable[[str], None] = print) -> list[Path]:
    """Remove template versions not in `keep`, not used by a running VMM, older than `grace`.

    With `names`, only versions of those templates are considered: a process that has used only
    some templates knows the current version of those alone, and must leave the others be.
    """
    keep_set = {p.resolve() for p in keep}
    only = None if names is None else set(names)
    in_use = _vmm_cmdlines()
    now = time.time()
    removed: list[Path] = []
    for version in sorted(templates_dir.glob("*/*")):
        if only is not None and version.parent.name not in only:
            continue
        if not version.is_dir() or version.resolve() in keep_set:
            continue
        if ".tmp-" in version.name:
            pid = version.name.rsplit(".tmp-", 1)[1]
            if pid.isdigit() and pid_is_running(int(pid)):
                continue  # a bake in progress
            # Its baker died (SIGKILL: no cleanup ran), and the VM it was baking is nobody's.
            # Left running, its command line kept the directory "in use", and the two stayed.
            _kill_vmms_naming(version, progress)
            in_use = _vmm_cmdlines()
        elif not _old(version, now, grace):
            continue
        names = {str(version) + "/", str(version.resolve()) + "/"}
        if any(name in line for line in in_use for name in names):
            continue
        if str(version.resolve()) in _HELD:
            continue
        fd = _held_elsewhere(version)
        if fd is None:
            continue
        try:
            shutil.rmtree(version, ignore_errors=True)
        finally:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        removed.append(version)
    if removed:
        progress(f"removed {len(removed)} unused template version(s)")
    return removed


def _wait_gone(pid: int, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while pid_is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.005)


def _kill_vmms_naming(directory: Path, progress: Callable[[str], None]) -> None:
    names = {str(directory) + "/", str(directory.resolve()) + "/"}
    for pid, argv in iter_cmdlines():
        if is_vmm_process(argv) and any(name in arg for arg in argv for name in names):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                progress(f"killed VMM {pid} of an abandoned template bake ({directory})")
                _wait_gone(pid)


def prune_images(images_dir: Path, templates_dir: Path, keep: Iterable[str], *,
                 grace: float = GRACE_S, progress: Callable[[str], None] = print) -> list[Path]:
    """Remove guest images that no remaining template was baked from."""
    wanted = set(keep)
    for meta in templates_dir.glob("*/*/template.json"):
        try:
            wanted.add(str(json.loads(meta.read_text())["image_key"]))
        except (OSError, ValueError, KeyError):
            continue
    now = time.time()
    removed: list[Path] = []
    for image in sorted(images_dir.glob("*")):
        if image.is_dir() and image.name not in wanted and not image.name.startswith(".") \
                and _old(image, now, grace):
            shutil.rmtree(image, ignore_errors=True)
            removed.append(image)
    if removed:
        progress(f"removed {len(removed)} unused guest image(s)")
    return removed


def orphan_vmms(cmdlines: Iterable[tuple[int, list[str]]] | None = None,
                ) -> list[tuple[int, Path]]:
    """(pid, workdir) of pandastack VMM processes whose working directory is gone.

    Every VM's directory (sandbox or template bake) exists before its VMM starts and is
    removed only after the VMM was killed, so a live VMM without one belongs to nobody: a
    runtime that crashed between the two steps, or a script that died before its kill. No
    runtime's adoption can see it (it looks only inside its own state directory).
    `cmdlines`: a `vmm.iter_cmdlines()` walk the caller already made."""
    found: list[tuple[int, Path]] = []
    for pid, argv in iter_cmdlines() if cmdlines is None else cmdlines:
        workdir = vm_workdir(argv)  # any driver's: VMMs of other runtimes count too
        if workdir is not None and _gone(pid, workdir):
            found.append((pid, workdir))
    return found


def _gone(pid: int, workdir: Path) -> bool:
    """Whether `workdir` is gone for us and for the VMM `pid` too: one in another mount
    namespace (an agent with private mounts, ADR 0021) may see a directory that we do not.
    A VMM's working directory is its work directory, or the jail inside it (ADR 0036), whose
    link in /proc names a removed one so; otherwise /proc/PID/root walks the path in that
    process's own view of the mounts (a jailed VMM's root is its jail: not that way)."""
    if workdir.exists():
        return False
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = ""
    if cwd.endswith(" (deleted)"):
        return True
    if cwd == str(workdir / JAIL_DIR):
        return False  # alive in a directory we cannot see
    return not os.path.exists(f"/proc/{pid}/root{workdir.absolute()}")


def kill_orphan_vmms(progress: Callable[[str], None] = print,
                     cmdlines: Iterable[tuple[int, list[str]]] | None = None,
                     ) -> list[tuple[int, Path]]:
    """Kill the VMMs `orphan_vmms(cmdlines)` finds; returns (pid, workdir) of each. Then
    remove VM cgroups nobody is in any more (of VMMs that died with their runtime)."""
    killed: list[tuple[int, Path]] = []
    for pid, workdir in orphan_vmms(cmdlines):
        # Checked again right before the kill: the pid must still be that VMM.
        argv = read_cmdline(pid)
        if not argv or not any(str(workdir) in a for a in argv) or not _gone(pid, workdir):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone, or another user's VMM
            continue
        progress(f"killed orphan VMM {pid} (its directory {workdir} is gone)")
        killed.append((pid, workdir))
    for pid, workdir in killed:
        _wait_gone(pid)
        cgroups.remove(cgroups.cgroup_name(workdir), wait_s=0.5)
    cgroups.remove_stale(progress)
    return killed
