"""The service's files on the host are private to it: directories 0700, files 0600.

They hold what sandboxes hold: disk overlays, memory files and snapshot streams (the guests'
data), the database (API key hashes, the URL-signing secret, env values). Two layers:

- The process umask is SERVICE_UMASK, set first thing by `serve` and `setup` and again by the
  runtime's `prepare` (for every other user of the runtime). Every file this process creates,
  and every file its children create (QEMU: console log, sockets; qemu-img: template disks),
  gets no group or other bits. QEMU is also started with it explicitly (host/vmm/qemu/driver.py).
- `make_private` makes every directory the runtime keeps files in 0700. An older install made
  them 0755 and its files 0644: a directory found open to others is made private with all it
  holds, once (afterwards it is 0700 and not walked again).

Guest images are the exception: the modes their build gives files are the guest's own, so the
build's commands run with the usual 0022 (host/images/common.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from pandastack.host.config import FORK_BUFFERS_ROOT, HUGETLB_CLAIMS_ROOT, HostConfig
from pandastack.hostport.errors import SetupError

SERVICE_UMASK = 0o077
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
# Guest image build trees in progress (image_common.atomic_dir, tempfile prefixes): their
# modes become the guest's, so a walk leaves them alone.
BUILD_TREE_PREFIX = ".tmp-"
SHARED_DIRS = frozenset({"/", "/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock"})


def restrict_umask() -> None:
    os.umask(SERVICE_UMASK)


def private_dirs(config: HostConfig) -> list[Path]:
    """Every directory the runtime keeps files in (outside them it writes none)."""
    dirs = [config.home, config.templates_dir, config.cache_dir, config.home / "network",
            config.sandboxes_dir, config.snapshots_dir, config.builds_dir,
            FORK_BUFFERS_ROOT, HUGETLB_CLAIMS_ROOT]
    if config.memory_stage_dir is not None:
        dirs.append(config.memory_stage_dir)
    return dirs


def make_private(config: HostConfig) -> None:
    """Set the umask and make the runtime's existing directories 0700 (the others are made
    when first needed, under that umask: 0700)."""
    restrict_umask()
    for directory in private_dirs(config):
        make_private_dir(directory)


def make_private_dir(directory: Path) -> None:
    try:
        try:
            st = directory.stat()
        except FileNotFoundError:
            return
        if stat.S_IMODE(st.st_mode) & ~PRIVATE_DIR == 0:
            return
        if _shared(directory, st):
            raise SetupError(f"{directory} is a shared directory (sticky bit): give pandastack "
                             "a directory of its own there")
        _close_tree(directory)
        os.chmod(directory, PRIVATE_DIR)  # last: a walk cut short is done again next time
    except OSError as exc:
        raise SetupError(f"cannot make {directory} private to the service: {exc}") from exc


def _shared(directory: Path, st: os.stat_result) -> bool:
    """/tmp, /dev/shm and the like: closing one would break every other user of it. A sticky
    directory that is a mount point of its own (a fresh tmpfs is 1777) is not shared."""
    if str(directory.resolve()) in SHARED_DIRS:
        return True
    return bool(st.st_mode & stat.S_ISVTX) and not os.path.ismount(directory)


def _close_tree(top: Path) -> None:
    """Drop the group and other bits of everything below `top` (not `top` itself)."""
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not d.startswith(BUILD_TREE_PREFIX)]
        for name in _entries(dirs, files):
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
            except FileNotFoundError:  # removed meanwhile (a sandbox ending)
                continue


def _entries(dirs: Iterable[str], files: Iterable[str]) -> Iterable[str]:
    yield from dirs
    yield from (f for f in files if not f.startswith(BUILD_TREE_PREFIX))


def private_file(path: Path) -> None:
    """Make an existing file 0600 (if it exists)."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, PRIVATE_FILE)
