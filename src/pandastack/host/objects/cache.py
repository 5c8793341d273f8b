"""The per-host cache of objects: `<home>/objects-cache/<2 hex>/<key>`, one read-only file per
object, whose bytes were checked against its key before it was put in place.

A download goes to `tmp/<key>.<random>.part` and is renamed into place once its sha256 is
right, so a reader never sees part of an object. `tmp/<key>.lock` (flock) makes processes that
share the cache download each key once; the lock file goes with the download. A file whose
size, mtime or inode changed since it was checked (something wrote it) is checked again
before it is used, and fetched again if it is no longer right. The check is remembered in a
user xattr where the file system has them (and in memory), so a restarted agent does not
hash its whole cache again.

Files stored as chunks (objects/chunks.py) have their chunks here like any object, and the
files made of them in `files/<key of the chunk list>`, sparse. With a size bound the cache
evicts what was used least recently (the last use is the file's atime, set on each use) and
that no file outside the cache links to: a materialised file that a snapshot or template
directory links stays, a chunk may always go (its file is whole without it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.objects.keys import sha256_of_file

CACHE_DIR_NAME = "objects-cache"
FILES_DIR_NAME = "files"
STAMP_XATTR = "user.pandastack.sha256"


def cache_dir_of(home: Path) -> Path:
    return home / CACHE_DIR_NAME


class ObjectCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.files = root / FILES_DIR_NAME
        self.files.mkdir(exist_ok=True)
        self._stamps: dict[str, tuple[int, int, int]] = {}  # key -> (size, mtime_ns, inode)
        self._stamps_lock = threading.Lock()
        self._xattrs = True
        self.sweep()

    def path_of(self, key: str) -> Path:
        return self.root / key[:2] / key

    def file_path_of(self, key: str) -> Path:
        """Where the file whose chunk list has `key` is materialised."""
        return self.files / key

    # -- checked files

    def _stamp_of(self, st: os.stat_result) -> tuple[int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def is_checked(self, key: str, path: Path | None = None) -> bool:
        """The cached file (`path`: a materialised one) is there and unchanged since its
        bytes were checked (no hashing: cheap enough for the event loop)."""
        path = self.path_of(key) if path is None else path
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        stamp = self._stamp_of(st)
        with self._stamps_lock:
            if self._stamps.get(str(path)) == stamp:
                return True
        if self._xattrs:
            try:
                recorded = os.getxattr(path, STAMP_XATTR).decode()
            except OSError:
                return False
            if recorded == _stamp_text(key, stamp):
                with self._stamps_lock:
                    self._stamps[str(path)] = stamp
                return True
        return False

    def check(self, key: str) -> bool:
        """True if the cached file is there and holds the key's bytes (hashing it if it
        changed since it was last checked); a file that does not is removed. Blocking."""
        if self.is_checked(key):
            return True
        path = self.path_of(key)
        try:
            right = sha256_of_file(path) == key
        except FileNotFoundError:
            return False
        if not right:
            self.remove(key)
            return False
        self._record(key, path)
        return True

    def _record(self, key: str, path: Path) -> None:
        stamp = self._stamp_of(path.stat())
        with self._stamps_lock:
            self._stamps[str(path)] = stamp
        if self._xattrs:
            try:
                os.setxattr(path, STAMP_XATTR, _stamp_text(key, stamp).encode())
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                self._xattrs = False  # remembered in memory only

    def remove(self, key: str, path: Path | None = None) -> None:
        path = self.path_of(key) if path is None else path
        with self._stamps_lock:
            self._stamps.pop(str(path), None)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def touch(self, path: Path) -> None:
        """Marks the file used now, for eviction: its atime (mount options such as relatime
        do not apply to a time set explicitly; the mtime, which the check's stamp holds,
        stays)."""
        with contextlib.suppress(FileNotFoundError):
            st = path.stat()
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))

    # -- downloads

    def new_temp(self, key: str) -> Path:
        return self.tmp / f"{key}.{secrets.token_hex(4)}.part"

    def install(self, key: str, temp: Path, path: Path | None = None) -> Path:
        """Puts a checked download (`path`: a materialised file) in place and returns its
        path."""
        path = self.path_of(key) if path is None else path
        path.parent.mkdir(exist_ok=True)
        # Read-only: users of the cache read it, or copy it (get_file's dest) to write.
        os.chmod(temp, 0o444)
        os.replace(temp, path)
        self._record(key, path)
        return path

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Held while `key` is checked or downloaded, by one thread of one process at a time.
        Blocking."""
        path = self.tmp / f"{key}.lock"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if not same:  # its holder removed it as we waited: take the new one
                    continue
                try:
                    yield
                finally:
                    # Removed while held: a waiter on this inode sees it gone and retries.
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                return
            finally:
                os.close(fd)

    def sweep(self) -> None:
        """Removes what downloads that were cut short left in tmp/ (a process that died), but
        not what one running now (another process on this cache) is writing: a key's files
        go only with its lock, taken without waiting."""
        keys = {path.name.split(".", 1)[0] for path in self.tmp.iterdir()}
        for key in keys:
            lock = self.tmp / f"{key}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being downloaded
                for part in self.tmp.glob(f"{key}.*.part"):
                    with contextlib.suppress(FileNotFoundError):
                        part.unlink()
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
            finally:
                os.close(fd)

    def temp_files(self) -> list[Path]:
        return sorted(self.tmp.iterdir())

    # -- eviction

    def entries(self) -> list[CacheEntry]:
        """Every object, chunk and materialised file in the cache (not tmp/)."""
        found = []
        for directory in self.root.iterdir():
            if directory == self.tmp or not directory.is_dir():
                continue
            for path in directory.iterdir():
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                found.append(CacheEntry(path, st.st_blocks * 512, st.st_atime_ns,
                                        st.st_nlink))
        return found

    def evict(self, limit_bytes: int, min_idle_s: float = 60.0) -> list[Path]:
        """Removes entries, least recently used first, until the cache holds at most
        `limit_bytes` (allocated); never one that a file outside the cache links to (a
        snapshot, template or sandbox directory holds it: removing the cache's name frees
        nothing), nor one used in the last `min_idle_s` (a fetch under way, in any process
        sharing the cache, reads its chunks). What it removed. Blocking."""
        entries = self.entries()
        total = sum(entry.allocated for entry in entries)
        removed: list[Path] = []
        idle_before = time.time_ns() - int(min_idle_s * 1e9)
        for entry in sorted(entries, key=lambda e: e.used_ns):
            if total <= limit_bytes:
                break
            if entry.links > 1 or entry.used_ns > idle_before:
                continue
            self.remove(entry.path.name, entry.path)
            total -= entry.allocated
            removed.append(entry.path)
        return removed


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    allocated: int  # bytes on disk (holes are none)
    used_ns: int  # the last use (atime)
    links: int


def _stamp_text(key: str, stamp: tuple[int, int, int]) -> str:
    size, mtime_ns, inode = stamp
    return f"{key} {size} {mtime_ns} {inode}"
