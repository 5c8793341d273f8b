"""Large files in the object store as fixed-size chunks (ADR 0016): each chunk of data is an
object under its own content key, all-zero chunks ("holes") are no object at all, and a small
chunk list (the file's size, the chunk size, each chunk's key or None) describes the file. The
sha256 of the list's canonical JSON is the file's key: it names the bytes as well as a hash of
them would, without hashing the zeros.

Why 4 MiB: the base rootfs (2 GiB, about 250 MiB of data in 1 MiB blocks) has data in 69
chunks of 4 MiB (276 MiB sent), 131 of 2 MiB (262 MiB), 37 of 8 MiB (296 MiB): below 4 MiB
the bytes saved are few and the requests many; above it, every changed byte of a memory
stream or a layer costs more to send again. A chunk is one PUT (under the 8 MiB part size, so
no multipart upload), and `parallel` of them in memory is 16 MiB.

Upload: the file's data ranges come from SEEK_DATA/SEEK_HOLE (a sparse rootfs is not read
where it has no blocks), each chunk with data is read and dropped if all zero, hashed, and
sent unless the store is known to have it: this process uploaded or found it before, or the
cache holds it (fetched from the store), else a HEAD says so. So a file that shares chunks
with one stored before (two templates on one rootfs base, a layer or stream that changed in a
few places) sends only what differs.

Fetch: the chunks come through the cache (ObjectStore.get_file: one download per chunk at a
time across the host's processes, each checked against its key), `parallel` at a time, and
are copied into the file at their offsets; holes are never written, so the file is as sparse
as the original was (at the chunk's own granularity inside a chunk with data).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.host.images.common import fsync_path
from pandastack.host.objects.keys import check_key, sha256_of_bytes
from pandastack.host.sparse import data_ranges

if TYPE_CHECKING:
    from pandastack.host.objects.store import ObjectStore

MiB = 1 << 20
CHUNK_SIZE = 4 * MiB
_ZERO = bytes(CHUNK_SIZE)


@dataclass(frozen=True)
class ChunkList:
    """A file as chunks: `chunks[i]` holds bytes [i * chunk_size, (i + 1) * chunk_size) of
    it (the last one fewer), by content key; None is a chunk of zeros."""

    size: int
    chunk_size: int
    chunks: tuple[str | None, ...]

    def __post_init__(self) -> None:
        if self.size < 0 or self.chunk_size <= 0:
            raise ValueError("a chunk list needs a size of 0 or more and a positive chunk size")
        if len(self.chunks) != -(-self.size // self.chunk_size):
            raise ValueError(f"{len(self.chunks)} chunks for {self.size} bytes in chunks of "
                             f"{self.chunk_size}")
        for key in self.chunks:
            if key is not None:
                check_key(key)

    @property
    def key(self) -> str:
        return sha256_of_bytes(json.dumps(self.to_json(), separators=(",", ":"),
                                          sort_keys=True).encode())

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "chunk_size": self.chunk_size, "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkList:
        return cls(int(data["size"]), int(data["chunk_size"]), tuple(data["chunks"]))

    def length_of(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)

    @property
    def data_keys(self) -> set[str]:
        return {key for key in self.chunks if key is not None}

    @property
    def data_bytes(self) -> int:
        return sum(self.length_of(i) for i, key in enumerate(self.chunks) if key is not None)


def data_chunks(fd: int, size: int, chunk_size: int) -> list[int]:
    """The indices of the chunks that hold any of the file's data blocks (SEEK_DATA), in
    order; every chunk where the file system cannot say."""
    count = -(-size // chunk_size)
    found: set[int] = set()
    for start, end in data_ranges(fd, size):
        found.update(range(start // chunk_size, (end - 1) // chunk_size + 1))
    return sorted(i for i in found if i < count)


class ChunkedFiles:
    """Chunked uploads and materialised files of one store (its bucket, cache, pool)."""

    def __init__(self, store: ObjectStore, chunk_size: int = CHUNK_SIZE) -> None:
        self.store = store
        self.chunk_size = chunk_size
        # Keys the store is known to hold: uploaded or seen (HEAD) by this process.
        self.known: set[str] = set()
        self._lock = threading.Lock()
        self._in_flight: dict[str, threading.Event] = {}
        self._files: dict[str, asyncio.Task[Path]] = {}

    # -- upload

    async def put(self, path: Path) -> ChunkList:
        """Stores the file as chunks; its chunk list. The file must not change meanwhile (a
        change that the stat shows fails the upload; the chunks sent stay, content-addressed,
        and no list names them)."""
        cancel = threading.Event()
        try:
            return await asyncio.to_thread(self._put, Path(path), cancel)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def _put(self, path: Path, cancel: threading.Event) -> ChunkList:
        with open(path, "rb") as f:
            fd = f.fileno()
            before = os.fstat(fd)
            size = before.st_size
            indices = data_chunks(fd, size, self.chunk_size)
            futures: dict[int, Future[str | None]] = {
                i: self.store._pool.submit(self._put_chunk, fd, i, size, cancel)
                for i in indices}
            try:
                keys = {i: future.result() for i, future in futures.items()}
            finally:
                cancel.set()  # what has not started does not start (the file closes next)
                for future in futures.values():
                    future.cancel()
                wait(futures.values())
            after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise RuntimeError(f"{path} changed while it was uploaded")
        count = -(-size // self.chunk_size)
        chunks = ChunkList(size, self.chunk_size, tuple(keys.get(i) for i in range(count)))
        self.store._count(holes=count - sum(1 for k in chunks.chunks if k is not None))
        return chunks

    def _put_chunk(self, fd: int, index: int, size: int, cancel: threading.Event) -> str | None:
        from pandastack.host.objects.store import TransferStopped

        if cancel.is_set() or self.store._closing.is_set():
            raise TransferStopped(f"upload of chunk {index} stopped")
        length = min(self.chunk_size, size - index * self.chunk_size)
        data = os.pread(fd, length, index * self.chunk_size)
        if len(data) != length:
            raise RuntimeError("a file shrank while it was uploaded")
        if data == (_ZERO if length == CHUNK_SIZE else bytes(length)):
            return None  # a hole: nothing stored
        key = hashlib.sha256(data).hexdigest()
        while True:
            with self._lock:
                if key in self.known:
                    break
                waiting = self._in_flight.get(key)
                if waiting is None:
                    mine = self._in_flight[key] = threading.Event()
            if waiting is not None:  # another file has the same chunk: its upload does
                waiting.wait()
                continue
            try:
                self._send(key, data)
            finally:
                with self._lock:
                    del self._in_flight[key]
                mine.set()
            return key
        self.store._count(chunks_known=1)
        return key

    def _send(self, key: str, data: bytes) -> None:
        store = self.store
        if store.cache.is_checked(key):  # fetched from the store: it has it
            store._count(chunks_known=1)
        elif store.bucket.size_of(key) == len(data):
            store._count(chunks_present=1)
        else:
            store.bucket.put(key, data)
            store._count(chunk_uploads=1, chunk_bytes_uploaded=len(data))
        with self._lock:
            self.known.add(key)

    # -- fetch

    async def materialise(self, chunks: ChunkList) -> Path:
        """The file as a read-only, sparse file of the cache (`files/<key>`), made once
        however many callers ask at the same time; link it, do not write it."""
        key = chunks.key
        path = self.store.cache.file_path_of(key)
        if self.store.cache.is_checked(key, path):
            self.store._count(cache_hits=1)
            await asyncio.to_thread(self.store.cache.touch, path)
            return path
        task = self._files.get(key)
        if task is None:
            task = asyncio.create_task(self._make(chunks, key, path))
            self._files[key] = task
            task.add_done_callback(lambda t: self.store._done(self._files, key, t))
        return await asyncio.shield(task)

    async def _make(self, chunks: ChunkList, key: str, path: Path) -> Path:
        cache = self.store.cache
        temp = cache.new_temp("f" + key)
        try:
            await self.write_to(chunks, temp)
            await asyncio.to_thread(fsync_path, temp)
            # Another process may have put the same file in place meanwhile: the same bytes.
            return await asyncio.to_thread(cache.install, key, temp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()

    async def write_to(self, chunks: ChunkList, dest: Path) -> None:
        """Writes the file to `dest` (made or replaced, writable, sparse), from the cached
        chunks, fetching those the cache lacks, `parallel` at a time."""
        fd = await asyncio.to_thread(os.open, dest,
                                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            await asyncio.to_thread(os.ftruncate, fd, chunks.size)
            limit = asyncio.Semaphore(self.store.config.parallel)

            async def one(index: int, chunk: str) -> None:
                async with limit:
                    for attempt in range(3):
                        cached = await self.store.get_file(chunk)
                        try:
                            await asyncio.to_thread(_copy_chunk, cached, fd,
                                                    index * chunks.chunk_size)
                            break
                        except FileNotFoundError:
                            # Evicted by another process between the fetch and the copy.
                            if attempt == 2:
                                raise
                    await asyncio.to_thread(self.store.cache.touch, cached)

            await asyncio.gather(*(one(i, k) for i, k in enumerate(chunks.chunks)
                                   if k is not None))
        finally:
            await asyncio.to_thread(os.close, fd)


def _copy_chunk(src: Path, fd: int, offset: int) -> None:
    """The chunk file's data ranges into `fd` at `offset` (its holes stay holes there)."""
    with open(src, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for start, end in data_ranges(f.fileno(), size):
            position = start
            while position < end:
                try:
                    copied = os.copy_file_range(f.fileno(), fd, end - position,
                                                offset_src=position,
                                                offset_dst=offset + position)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                         errno.EOPNOTSUPP):
                        raise
                    data = os.pread(f.fileno(), min(end - position, MiB), position)
                    copied = os.pwrite(fd, data, offset + position)
                if copied <= 0:
                    raise OSError(errno.EIO, f"short copy of {src}")
                position += copied


