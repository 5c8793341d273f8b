"""Files written inside a root directory that a layer (or a user) made: every path resolved
component by component from the root's file descriptor, a symlink on the way followed as if
the root were `/` (an absolute target from the root, `..` stopping at it), and every open
O_NOFOLLOW, so no write ever leaves the root whatever links it holds."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from pandastack.host.images.oci.errors import UnsafeLayerEntry

MAX_SYMLINK_HOPS = 40
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class InsideRoot:
    def __init__(self, root: Path, image: str) -> None:
        self.fd = os.open(root, DIR_FLAGS)
        self.image = image

    def close(self) -> None:
        os.close(self.fd)

    def open_dir(self, parts: Iterable[str]) -> int:
        fd = os.dup(self.fd)
        try:
            for part in parts:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def resolve_dir(self, parts: tuple[str, ...], name: str, *,
                    create: bool) -> tuple[tuple[str, ...], int]:
        """The real path (no symlinks) of directory `parts` inside the root and an open fd of
        it; symlinks on the way are followed as if the root were `/`; missing directories
        are made when `create`."""
        resolved: list[str] = []
        pending = list(parts)
        hops = 0
        fd = os.dup(self.fd)
        try:
            while pending:
                part = pending.pop(0)
                if part in ("", "."):
                    continue
                if part == "..":
                    if resolved:
                        resolved.pop()
                    os.close(fd)
                    fd = self.open_dir(resolved)
                    continue
                created = False
                try:
                    info = os.lstat(part, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise UnsafeLayerEntry(self.image, f"{name!r}: {'/'.join(resolved)}"
                                                           f"/{part} does not exist") from None
                    os.mkdir(part, 0o700, dir_fd=fd)
                    info = os.lstat(part, dir_fd=fd)
                    created = True
                if stat.S_ISLNK(info.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise UnsafeLayerEntry(self.image, f"{name!r}: too many symlinks")
                    target = os.readlink(part, dir_fd=fd)
                    if target.startswith("/"):
                        resolved = []
                        os.close(fd)
                        fd = os.dup(self.fd)
                    pending[:0] = target.split("/")
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    raise UnsafeLayerEntry(self.image, f"{name!r}: {'/'.join(resolved)}/{part}"
                                                       " is not a directory")
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
                if created:  # a directory the layer did not list: as Docker makes them
                    os.fchmod(fd, 0o755)
                resolved.append(part)
        except BaseException:
            os.close(fd)
            raise
        return tuple(resolved), fd


    def _parent(self, rel: str) -> tuple[str, int]:
        parts = tuple(p for p in rel.split("/") if p not in ("", "."))
        if not parts or ".." in parts:
            raise ValueError(f"not a path inside the root: {rel!r}")
        return parts[-1], self.resolve_dir(parts[:-1], rel, create=True)[1]

    def write_file(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Replace whatever `rel` is (a symlink too: it is not followed) with a file."""
        leaf, parent = self._parent(rel)
        try:
            remove_entry(parent, leaf)
            fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=parent)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        finally:
            os.close(parent)

    def symlink(self, rel: str, target: str) -> None:
        leaf, parent = self._parent(rel)
        try:
            remove_entry(parent, leaf)
            os.symlink(target, leaf, dir_fd=parent)
        finally:
            os.close(parent)

    def make_dir(self, rel: str, mode: int = 0o755) -> None:
        """A directory at `rel` (what was there, if not a directory, is replaced)."""
        leaf, parent = self._parent(rel)
        try:
            info = _lstat(parent, leaf)
            if info is None or not stat.S_ISDIR(info.st_mode):
                remove_entry(parent, leaf)
                os.mkdir(leaf, 0o700, dir_fd=parent)
            fd = os.open(leaf, DIR_FLAGS, dir_fd=parent)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        finally:
            os.close(parent)

    def entry(self, rel: str) -> os.stat_result | None:
        """What `rel` names inside the root (its last component not followed), or None."""
        parts = tuple(p for p in rel.split("/") if p not in ("", "."))
        try:
            _, parent = self.resolve_dir(parts[:-1], rel, create=False)
        except (UnsafeLayerEntry, OSError):
            return None
        try:
            return _lstat(parent, parts[-1])
        finally:
            os.close(parent)


def _lstat(parent_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return None


def remove_entry(parent_fd: int, name: str) -> None:
    try:
        info = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=parent_fd)  # fd-based: never follows a symlink inside
    else:
        os.unlink(name, dir_fd=parent_fd)
