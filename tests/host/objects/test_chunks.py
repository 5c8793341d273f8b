"""Large files as chunks (objects/chunks.py) against the real S3 server: holes are never sent,
chunks the store has are not sent again, a fetch writes a sparse file from checked chunks,
and the cache's size bound evicts only what no file outside it links to."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pandastack.host.objects import ObjectStore, ObjectStoreConfig
from pandastack.host.objects.chunks import CHUNK_SIZE, ChunkList
from pandastack.hostport.errors import ObjectStoreError

MiB = 1 << 20


def sparse_file(path: Path, size: int, data_at: dict[int, bytes]) -> None:
    """A sparse file of `size` bytes with `data_at[offset]` written there, holes elsewhere."""
    with open(path, "wb") as f:
        for offset, data in data_at.items():
            f.seek(offset)
            f.write(data)
        f.truncate(size)


def watch(store: ObjectStore, operation: str) -> list[int]:
    """The body sizes of the store's requests of `operation` (PutObject, GetObject...)."""
    sizes: list[int] = []

    def seen(request: Any, **_: object) -> None:
        sizes.append(int(request.headers.get("Content-Length") or 0))

    store.bucket.client.meta.events.register(f"before-send.s3.{operation}", seen)
    return sizes


@pytest.fixture
async def other_store(store_config: ObjectStoreConfig,
                      tmp_path: Path) -> AsyncIterator[Callable[..., ObjectStore]]:
    """Stores over the same bucket and prefix with caches of their own (other hosts); closed
    and checked after the test."""
    made: list[ObjectStore] = []

    def make(name: str, limit: int | None = None) -> ObjectStore:
        made.append(ObjectStore(store_config, tmp_path / name / "objects-cache", limit))
        return made[-1]

    yield make
    for st in made:
        await st.close()
        assert st.cache.temp_files() == [], "temp files left in the object cache"


async def test_holes_are_not_uploaded_and_come_back_as_holes(
        store: ObjectStore, other_store: Callable[..., ObjectStore], tmp_path: Path) -> None:
    path = tmp_path / "disk.img"
    data = os.urandom(CHUNK_SIZE + 1000)
    # 64 MiB: data across chunks 2 and 3, a chunk written with zeros (allocated, no data),
    # a few bytes in the last chunk, holes elsewhere.
    sparse_file(path, 64 * MiB, {2 * CHUNK_SIZE + 5: data, 6 * CHUNK_SIZE: bytes(CHUNK_SIZE),
                                 64 * MiB - 10: b"tail"})
    puts = watch(store, "PutObject")
    chunks = await store.files.put(path)
    assert chunks.size == 64 * MiB and len(chunks.chunks) == 16
    assert [i for i, key in enumerate(chunks.chunks) if key is not None] == [2, 3, 15]
    assert len(puts) == 3
    assert sum(puts) == 3 * CHUNK_SIZE  # the chunks with data, nothing of the holes
    assert (store.stats.chunk_uploads, store.stats.holes) == (3, 13)

    reader = other_store("reader")
    try:
        gets = watch(reader, "GetObject")
        made = await reader.files.materialise(chunks)
        assert made.read_bytes() == path.read_bytes()
        assert len(gets) == 3
        # Sparse: about the three chunks' data on disk, not 64 MiB.
        assert made.stat().st_blocks * 512 <= 3 * CHUNK_SIZE + MiB
        assert not os.access(made, os.W_OK) or os.geteuid() == 0
        assert made.stat().st_mode & 0o222 == 0
        # A writable copy elsewhere is sparse too, and needs no request.
        copy = tmp_path / "copy.img"
        await reader.files.write_to(chunks, copy)
        assert copy.read_bytes() == path.read_bytes()
        assert copy.stat().st_blocks * 512 <= 3 * CHUNK_SIZE + MiB
        assert len(gets) == 3
    finally:
        await reader.close()


async def test_chunks_the_store_has_are_not_sent_again(
        store: ObjectStore, other_store: Callable[..., ObjectStore], tmp_path: Path) -> None:
    first = tmp_path / "first"
    base = os.urandom(5 * CHUNK_SIZE + 123)
    first.write_bytes(base)
    one = await store.files.put(first)
    assert store.stats.chunk_uploads == 6

    # One chunk changed (a stream or a layer that differs in one place), on another host
    # that knows nothing yet: HEADs find the rest, one chunk is sent.
    second = tmp_path / "second"
    changed = bytearray(base)
    changed[3 * CHUNK_SIZE + 7] ^= 0xFF
    second.write_bytes(changed)
    other = other_store("other")
    try:
        puts = watch(other, "PutObject")
        two = await other.files.put(second)
        assert len(puts) == 1 and puts[0] == CHUNK_SIZE
        assert [a == b for a, b in zip(one.chunks, two.chunks, strict=True)] == [
            True, True, True, False, True, True]
        assert (other.stats.chunk_uploads, other.stats.chunks_present) == (1, 5)

        # The same host again: it knows what it sent or saw, so not even a HEAD.
        heads = watch(other, "HeadObject")
        third = tmp_path / "third"
        third.write_bytes(bytes(changed[:4 * CHUNK_SIZE]) + os.urandom(CHUNK_SIZE))
        three = await other.files.put(third)
        assert len(puts) == 2  # the new last chunk only
        assert len(heads) == 1  # for it
        assert three.chunks[:4] == two.chunks[:4]

        # A fetch of the second file by a host that fetched the first gets only the chunk
        # that differs.
        reader = other_store("reader")
        try:
            gets = watch(reader, "GetObject")
            assert (await reader.files.materialise(one)).read_bytes() == base
            assert len(gets) == 6
            assert (await reader.files.materialise(two)).read_bytes() == bytes(changed)
            assert len(gets) == 7
        finally:
            await reader.close()
    finally:
        await other.close()


async def test_concurrent_fetches_of_a_file_share_one_download_per_chunk(
        store: ObjectStore, other_store: Callable[..., ObjectStore], tmp_path: Path) -> None:
    path = tmp_path / "f"
    same = os.urandom(CHUNK_SIZE)
    path.write_bytes(same + os.urandom(CHUNK_SIZE) + same)  # one chunk twice
    chunks = await store.files.put(path)
    assert store.stats.chunk_uploads == 2
    reader = other_store("reader")
    try:
        gets = watch(reader, "GetObject")
        paths = await asyncio.gather(*(reader.files.materialise(chunks) for _ in range(8)))
        assert set(paths) == {reader.cache.file_path_of(chunks.key)}
        assert len(gets) == 2
        assert paths[0].read_bytes() == path.read_bytes()
    finally:
        await reader.close()


async def test_a_corrupted_chunk_is_refused(
        store: ObjectStore, other_store: Callable[..., ObjectStore], tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(2 * CHUNK_SIZE))
    chunks = await store.files.put(path)
    bad = chunks.chunks[1]
    assert bad is not None
    # Other bytes under the chunk's key (a bad disk or a bad writer in the store).
    await asyncio.to_thread(store.bucket.put, bad, os.urandom(CHUNK_SIZE))
    reader = other_store("reader")
    try:
        with pytest.raises(ObjectStoreError, match="holds other bytes"):
            await reader.files.materialise(chunks)
        assert not reader.cache.file_path_of(chunks.key).exists()
        assert not reader.cache.path_of(bad).exists()
    finally:
        await reader.close()


async def test_eviction_keeps_what_a_file_outside_the_cache_links(
        store: ObjectStore, other_store: Callable[..., ObjectStore], tmp_path: Path) -> None:
    kept_src, dropped_src = tmp_path / "kept", tmp_path / "dropped"
    kept_src.write_bytes(os.urandom(2 * CHUNK_SIZE))
    dropped_src.write_bytes(os.urandom(2 * CHUNK_SIZE))
    kept, dropped = await store.files.put(kept_src), await store.files.put(dropped_src)

    reader = other_store("reader", limit=3 * CHUNK_SIZE)
    try:
        linked = tmp_path / "snapshot-dir-link"
        os.link(await reader.files.materialise(kept), linked)  # what a snapshot dir does
        await reader.files.materialise(dropped)
        assert await reader.evict(min_idle_s=60) == 0  # all used just now
        removed = await reader.evict(min_idle_s=0)
        assert removed > 0
        left = {entry.path for entry in reader.cache.entries()}
        assert reader.cache.file_path_of(kept.key) in left
        assert sum(entry.allocated for entry in reader.cache.entries()) <= 3 * CHUNK_SIZE
        assert linked.read_bytes() == kept_src.read_bytes()
        # What was evicted comes back from the store when asked for again.
        assert (await reader.files.materialise(dropped)).read_bytes() == \
            dropped_src.read_bytes()
    finally:
        await reader.close()


def test_a_chunk_list_names_its_bytes() -> None:
    key = "ab" * 32
    one = ChunkList(10 * MiB, CHUNK_SIZE, (key, None, key))
    assert ChunkList.from_json(one.to_json()) == one
    assert one.key == ChunkList.from_json(one.to_json()).key
    assert one.key != ChunkList(10 * MiB - 1, CHUNK_SIZE, (key, None, key)).key
    assert one.data_bytes == CHUNK_SIZE + 2 * MiB
    with pytest.raises(ValueError):
        ChunkList(10 * MiB, CHUNK_SIZE, (key, None))
    with pytest.raises(ValueError):
        ChunkList(MiB, CHUNK_SIZE, ("not-a-key",))
