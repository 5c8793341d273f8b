"""The host's object store: files in, content-addressed keys out, and those keys back as
files in the per-host cache (ADR 0016).

Every boto3 call runs in a thread (an upload's parts in the store's own pool, so a big upload
does not take the event loop's default executor); at most `parallel` parts of
`part_size` bytes of an upload are in memory at a time, and downloads stream to files.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import os
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pandastack.host.objects.cache import ObjectCache, cache_dir_of
from pandastack.host.objects.chunks import ChunkedFiles
from pandastack.host.objects.config import ObjectStoreConfig
from pandastack.host.objects.keys import check_key, sha256_of_bytes, sha256_of_file
from pandastack.host.objects.s3 import S3Bucket
from pandastack.hostport.errors import ObjectStoreError

MAX_RANGE = 64 << 20  # what one read_range may ask for (it comes back in memory)
_MANIFEST_NAME = re.compile(r"[a-z0-9][a-z0-9._/-]{0,200}")


@dataclass
class ObjectStats:
    """What this store did since it was made (for tests, logs and benchmarks)."""

    uploads: int = 0  # objects written
    parts: int = 0  # parts of multipart uploads written
    skipped_uploads: int = 0  # put_file of an object the store already had
    downloads: int = 0  # objects fetched into the cache
    cache_hits: int = 0
    refetches: int = 0  # cached files found changed and fetched again
    manifest_reads: int = 0  # GETs of manifests (found or not)
    manifest_writes: int = 0
    # Chunked files (objects/chunks.py):
    chunk_uploads: int = 0  # chunks sent
    chunk_bytes_uploaded: int = 0
    chunks_known: int = 0  # chunks not sent: known to be in the store (no request)
    chunks_present: int = 0  # chunks not sent: the store had them (a HEAD)
    holes: int = 0  # chunks of zeros: nothing stored
    evicted: int = 0  # cache entries removed for the size bound


class TransferStopped(ObjectStoreError):
    """An upload whose caller went away, or a transfer of a store being closed, stopped (and
    left nothing behind)."""


class ObjectStore:
    def __init__(self, config: ObjectStoreConfig, cache_dir: Path,
                 cache_limit_bytes: int | None = None) -> None:
        """`cache_limit_bytes`: what the cache may hold (`evict`); None: no bound."""
        self.config = config
        self.bucket = S3Bucket(config)
        self.cache = ObjectCache(cache_dir)
        self.cache_limit_bytes = cache_limit_bytes
        self.files = ChunkedFiles(self)
        self.stats = ObjectStats()
        self._stats_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(config.parallel, thread_name_prefix="objects-part")
        self._closing = threading.Event()  # stops the threads of downloads and uploads
        self._fetches: dict[str, asyncio.Task[Path]] = {}
        self._uploads: dict[str, asyncio.Task[None]] = {}

    @classmethod
    def from_env(cls, home: Path, env: Mapping[str, str] | None = None) -> ObjectStore | None:
        """The store PANDASTACK_OBJECT_STORE names, caching in `<home>/objects-cache`; None
        where it is not set."""
        config = ObjectStoreConfig.from_env(env)
        return None if config is None else cls(config, cache_dir_of(home))

    async def close(self) -> None:
        # Not cancelled: their threads would go on. They stop at their next chunk or part.
        self._closing.set()
        await asyncio.gather(*self._fetches.values(), *self._uploads.values(),
                             return_exceptions=True)
        await asyncio.to_thread(self._pool.shutdown)
        self.bucket.close()

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    # -- writing

    async def put_file(self, path: Path, key: str | None = None) -> str:
        """Stores the file's bytes and returns their key; nothing is sent when the store has
        them already. The file must not change until this returns (an upload that sees other
        bytes than it hashed fails, and stores nothing under either key). `key`: the file's
        key if the caller knows it (it hashed this very file before), which saves hashing a
        large file the store already has; an upload still checks the bytes it sends."""
        size = (await asyncio.to_thread(os.stat, path)).st_size
        if size <= self.config.part_size:
            data = await asyncio.to_thread(_read_at_most, path, self.config.part_size)
            key = sha256_of_bytes(data)
            await self._single_flight_upload(key, functools.partial(self._put_small, key, data))
        else:
            key = check_key(key) if key is not None else \
                await asyncio.to_thread(sha256_of_file, path)
            await self._single_flight_upload(
                key, functools.partial(self._put_large, key, Path(path), size))
        return key

    async def _single_flight_upload(self, key: str,
                                    upload: Callable[[threading.Event], None]) -> None:
        task = self._uploads.get(key)
        if task is None:
            task = asyncio.create_task(self._run_upload(upload))
            self._uploads[key] = task
            task.add_done_callback(lambda t: self._done(self._uploads, key, t))
        await asyncio.shield(task)

    async def _run_upload(self, upload: Callable[[threading.Event], None]) -> None:
        cancel = threading.Event()
        try:
            await asyncio.to_thread(upload, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the thread stops at its next part and aborts the upload
            raise

    def _put_small(self, key: str, data: bytes, cancel: threading.Event) -> None:
        if self.bucket.size_of(key) == len(data):
            self._count(skipped_uploads=1)
            return
        self.bucket.put(key, data)
        self._count(uploads=1)

    def _put_large(self, key: str, path: Path, size: int, cancel: threading.Event) -> None:
        if self.bucket.size_of(key) == size:
            self._count(skipped_uploads=1)
            return
        part_size = self.config.part_size_for(size)
        upload_id = self.bucket.start_multipart(key)
        done = False
        in_flight: list[Future[str]] = []
        try:
            digest = hashlib.sha256()
            etags: list[str] = []
            with open(path, "rb") as f:
                number = 0
                while data := f.read(part_size):
                    if cancel.is_set() or self._closing.is_set():
                        raise TransferStopped(f"transfer of {key} stopped")
                    number += 1
                    digest.update(data)
                    in_flight.append(self._pool.submit(self.bucket.put_part, key, upload_id,
                                                       number, data))
                    del data
                    # Parts are read in order and at most `parallel` are held at a time.
                    while len(in_flight) >= self.config.parallel:
                        etags.append(in_flight.pop(0).result())
            etags.extend(future.result() for future in in_flight)
            in_flight.clear()
            if digest.hexdigest() != key:
                raise RuntimeError(f"{path} changed while it was uploaded")
            self.bucket.complete_multipart(key, upload_id, etags)
            done = True
            self._count(uploads=1, parts=len(etags))
        finally:
            for future in in_flight:
                future.cancel()
            wait(in_flight)  # parts being sent land before the abort, not after it
            if not done:
                self.bucket.abort_multipart(key, upload_id)

    # -- reading

    async def get_file(self, key: str, dest: Path | None = None) -> Path:
        """The object as a file: its read-only copy in the cache (downloaded once, however
        many callers ask at the same time, and checked against its key), or, with `dest`, a
        writable copy there (a reflink where the file system can)."""
        check_key(key)
        if self.cache.is_checked(key):
            self._count(cache_hits=1)
            path = self.cache.path_of(key)
            self.cache.touch(path)
        else:
            task = self._fetches.get(key)
            if task is None:
                task = asyncio.create_task(asyncio.to_thread(self._fetch, key))
                self._fetches[key] = task
                task.add_done_callback(lambda t: self._done(self._fetches, key, t))
            path = await asyncio.shield(task)
        if dest is None:
            return path
        await asyncio.to_thread(_copy_out, path, dest)
        return dest

    def _fetch(self, key: str) -> Path:
        with self.cache.lock(key):
            path = self.cache.path_of(key)
            existed = path.exists()
            if self.cache.check(key):  # another process fetched it, or it was only touched
                self._count(cache_hits=1)
                return path
            if existed:
                self._count(refetches=1)
            temp = self.cache.new_temp(key)
            try:
                digest = hashlib.sha256()
                def seen(chunk: bytes) -> None:
                    if self._closing.is_set():
                        raise TransferStopped(f"transfer of {key} stopped")
                    digest.update(chunk)

                with open(temp, "wb") as out:
                    size = self.bucket.download(key, out, seen)
                    # Zero chunks were skipped (sparse.write): the end may be a hole.
                    out.truncate(size)
                    out.flush()
                    os.fsync(out.fileno())  # before the rename makes it the cached copy
                if digest.hexdigest() != key:
                    raise ObjectStoreError(f"the object {key} in the {self.config.describe()} "
                                           f"holds other bytes (sha256 {digest.hexdigest()})")
                path = self.cache.install(key, temp)
                self._count(downloads=1)
                return path
            finally:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()

    async def read_range(self, key: str, offset: int, length: int) -> bytes:
        """`length` bytes of the object from `offset` (fewer at its end), from the cached
        file if there is one, else by a ranged GET; at most MAX_RANGE bytes."""
        check_key(key)
        if offset < 0 or length < 0:
            raise ValueError("offset and length must be 0 or more")
        if length > MAX_RANGE:
            raise ValueError(f"read_range reads at most {MAX_RANGE} bytes, not {length}")
        if length == 0:
            return b""
        if self.cache.is_checked(key):
            return await asyncio.to_thread(_pread, self.cache.path_of(key), offset, length)
        return await asyncio.to_thread(self.bucket.read_range, key, offset, length)

    async def evict(self, min_idle_s: float = 60.0) -> int:
        """Brings the cache under its bound (least recently used first, never a file linked
        from outside the cache); how many entries went. Nothing without a bound."""
        if self.cache_limit_bytes is None:
            return 0
        removed = await asyncio.to_thread(self.cache.evict, self.cache_limit_bytes, min_idle_s)
        self._count(evicted=len(removed))
        return len(removed)

    # -- manifests: small named objects that say which keys make up a thing (a snapshot, a
    # hibernated sandbox); unlike objects they are replaced and deleted

    async def put_manifest(self, name: str, data: bytes) -> None:
        await asyncio.to_thread(self.bucket.put_manifest, _manifest_name(name), data)
        self._count(manifest_writes=1)

    async def get_manifest(self, name: str) -> bytes | None:
        """The manifest's bytes, or None where the store has none by that name."""
        self._count(manifest_reads=1)
        return await asyncio.to_thread(self.bucket.get_manifest, _manifest_name(name))

    async def delete_manifest(self, name: str) -> None:
        """Removes the manifest (none by that name is no error); the objects it names stay:
        other manifests may name them too."""
        await asyncio.to_thread(self.bucket.delete_manifest, _manifest_name(name))

    async def list_manifests(self, under: str = "") -> list[str]:
        """The names of the manifests (below `under`, e.g. "snapshots/")."""
        return await asyncio.to_thread(self.bucket.list_manifests, under)

    async def exists(self, key: str) -> bool:
        check_key(key)
        return await asyncio.to_thread(self.bucket.size_of, key) is not None

    async def size_of(self, key: str) -> int | None:
        check_key(key)
        return await asyncio.to_thread(self.bucket.size_of, key)

    async def delete(self, key: str) -> None:
        """Removes the object from the store and from this host's cache (other hosts' caches
        keep theirs: nothing there changes, an object never does)."""
        check_key(key)
        await asyncio.to_thread(self.bucket.delete, key)
        self.cache.remove(key)

    async def list_keys(self) -> AsyncIterator[str]:
        """Every key in the store, a page at a time."""
        after: str | None = None
        while True:
            page, after = await asyncio.to_thread(self.bucket.list_page, after)
            for key in page:
                yield key
            if after is None:
                return

    @staticmethod
    def _done(tasks: dict[str, Any], key: str, task: asyncio.Task[Any]) -> None:
        if tasks.get(key) is task:
            del tasks[key]
        if not task.cancelled():
            task.exception()  # seen by its callers; not "never retrieved" if they left


def _manifest_name(name: str) -> str:
    if not _MANIFEST_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"not a manifest name: {name!r}")
    return name


def _read_at_most(path: Path, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RuntimeError(f"{path} grew while it was uploaded")
    return data


def _pread(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), length, offset)


def _copy_out(src: Path, dest: Path) -> None:
    temp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        with open(src, "rb") as fin, open(temp, "wb") as fout:
            try:
                remaining = os.fstat(fin.fileno()).st_size
                while remaining > 0:  # shares the blocks where the file system can (xfs, btrfs)
                    copied = os.copy_file_range(fin.fileno(), fout.fileno(), remaining)
                    if copied == 0:
                        break
                    remaining -= copied
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                fin.seek(0)
                fout.seek(0)
                fout.truncate()
                shutil.copyfileobj(fin, fout, 1 << 20)
        os.chmod(temp, 0o644)
        os.replace(temp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
