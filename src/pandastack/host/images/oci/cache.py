"""Compressed layer blobs by digest, shared by every image and template on the host, bounded
in size with least-recently-used eviction (ADR 0046).

    <root>/blobs/sha256/<hex>          the blob as the registry served it (digest verified)
    <root>/blobs/sha256/<hex>.sources  registry/repository names it was verified from
    <root>/.lock                       held while adding, recording or evicting (short)

A blob's modification time is its last use. A blob open for a pull holds a shared lock on
it, and eviction passes over a locked blob: a layer in use is never evicted (an evicted
one's open file would still read, but its bytes would be fetched again by the next pull).
A cached blob serves a pull only from a
repository it was verified from: the pull fetched that repository's manifest with its own
credentials just before (a registry we cannot see into answers the manifest only to those
who may pull), so a team without access never reaches the cache. From any other repository
the blob is fetched and verified again first: a registry that only claims to have a digest
(a HEAD costs nothing to lie with) gets no other repository's bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from pandastack.host.images.common import file_lock

MAX_SOURCES = 256
_TMP = ".tmp-"


class LayerCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._blobs = root / "blobs" / "sha256"
        self._lock = root / ".lock"

    def _path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != "sha256" or len(hexdigest) != 64 \
                or not all(c in "0123456789abcdef" for c in hexdigest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self._blobs / hexdigest

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with file_lock(self._lock):
            yield

    def sources(self, digest: str) -> list[str]:
        try:
            text = self._path(digest).with_suffix(".sources").read_text()
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line]

    def open(self, digest: str, source: str) -> BinaryIO | None:
        """The blob, opened (it stays readable if evicted meanwhile), when it was verified
        from `source`; its use recorded for eviction."""
        path = self._path(digest)
        if source not in self.sources(digest):
            return None
        try:
            blob = path.open("rb")
        except FileNotFoundError:
            return None
        fcntl.flock(blob.fileno(), fcntl.LOCK_SH)  # in use until closed: evict passes it
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)
        return blob

    def add(self, digest: str, source: str, write: Callable[[BinaryIO], object]) -> BinaryIO:
        """Store what `write` writes (it raises unless those are the digest's bytes), record
        `source`, and return the blob opened."""
        self._blobs.mkdir(parents=True, exist_ok=True)
        tmp = self._blobs / f"{_TMP}{uuid.uuid4().hex}"
        with self._locked():  # made and locked before a sweep (under this lock) can see it
            out = tmp.open("w+b")
            fcntl.flock(out.fileno(), fcntl.LOCK_EX)
        try:
            write(out)
            out.flush()
            os.fsync(out.fileno())
            blob = tmp.open("rb")
            with self._locked():
                os.replace(tmp, self._path(digest))
                self._record(digest, source)
                # From the download's exclusive lock to the reader's shared one, under the
                # cache's lock: no eviction sees the blob unlocked between the two.
                out.close()
                fcntl.flock(blob.fileno(), fcntl.LOCK_SH)
        finally:
            out.close()
            tmp.unlink(missing_ok=True)
        return blob

    def _sweep(self) -> None:
        """Remove what killed downloads left (under the lock): a download in progress holds
        a lock on its file, a leftover's lock is free."""
        for path in self._blobs.glob(f"{_TMP}*"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            finally:
                os.close(fd)
            path.unlink(missing_ok=True)

    def _record(self, digest: str, source: str) -> None:
        known = self.sources(digest)
        if source in known:
            return
        sources = self._path(digest).with_suffix(".sources")
        tmp = sources.with_name(f"{_TMP}{uuid.uuid4().hex}")
        tmp.write_text("".join(f"{s}\n" for s in [*known, source][-MAX_SOURCES:]))
        os.replace(tmp, sources)

    def size(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[Path, int, float]]:
        entries = []
        if not self._blobs.is_dir():
            return []
        for path in self._blobs.iterdir():
            if path.suffix or path.name.startswith(_TMP):
                continue
            with contextlib.suppress(FileNotFoundError):
                info = path.stat()
                entries.append((path, info.st_size, info.st_mtime))
        return entries

    def evict(self, keep: Iterable[str] = ()) -> int:
        """Remove the least recently used blobs (never those in `keep`, the digests a pull
        is using, nor one any pull has open) until the cache is within its bound; returns
        the bytes removed."""
        kept = {self._path(d) for d in keep}
        removed = 0
        with self._locked():
            if self._blobs.is_dir():
                self._sweep()
            entries = sorted(self._entries(), key=lambda e: e[2])
            total = sum(size for _, size, _ in entries)
            for path, size, _ in entries:
                if total <= self.max_bytes:
                    break
                if path in kept or not self._remove_unused(path):
                    continue
                total -= size
                removed += size
        return removed

    def _remove_unused(self, path: Path) -> bool:
        """Remove a blob no pull has open (under the cache's lock, so no pull opens it
        meanwhile but one that already looked it up: that one still reads whole bytes)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            path.unlink(missing_ok=True)
            path.with_suffix(".sources").unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)
