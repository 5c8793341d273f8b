"""The object store against a real S3 server (OpenStack Swift's s3api, scripts/s3-server)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from pandastack.host.objects import ObjectStore, ObjectStoreConfig
from pandastack.host.objects.store import TransferStopped
from pandastack.hostport.errors import ObjectNotFound, ObjectStoreError, ObjectStoreUnavailable
from pandastack.server.web.errors import from_host_error

MiB = 1 << 20


def random_file(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("objects") / "big"
    return path, random_file(path, 40 * MiB + 12345)  # not a whole number of parts


def new_store(config: ObjectStoreConfig, cache: Path) -> ObjectStore:
    return ObjectStore(config, cache)


def count_gets(store: ObjectStore) -> list[str]:
    gets: list[str] = []
    store.bucket.client.meta.events.register(
        "before-send.s3.GetObject", lambda request, **_: gets.append(request.url))
    return gets


async def test_round_trip_of_a_big_file_in_parallel_parts(
        store: ObjectStore, store_config: ObjectStoreConfig, big_file: tuple[Path, str],
        tmp_path: Path) -> None:
    path, digest = big_file
    key = await store.put_file(path)
    assert key == digest
    assert (store.stats.uploads, store.stats.parts) == (1, 6)  # 8 MiB parts
    assert await store.exists(key)
    assert await store.size_of(key) == path.stat().st_size

    # Another host: an empty cache.
    other = new_store(store_config, tmp_path / "other-cache")
    try:
        cached = await other.get_file(key)
        assert cached == other.cache.path_of(key)
        assert cached.read_bytes() == path.read_bytes()
        assert not cached.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        assert other.stats.downloads == 1

        copy = await other.get_file(key, tmp_path / "mine")
        assert copy == tmp_path / "mine"
        assert copy.read_bytes() == path.read_bytes()
        copy.write_bytes(b"changed")  # a writable copy: the cached file is not touched
        assert await other.get_file(key) == cached
        assert other.stats.downloads == 1
        assert other.cache.check(key)
    finally:
        await other.close()
    assert other.cache.temp_files() == []


async def test_a_second_put_of_the_same_bytes_uploads_nothing(
        store: ObjectStore, big_file: tuple[Path, str], tmp_path: Path) -> None:
    path, digest = big_file
    small = tmp_path / "small"
    small_key = random_file(small, 1000)
    assert await store.put_file(path) == digest
    assert await store.put_file(small) == small_key
    assert store.stats.uploads == 2

    copy = tmp_path / "same-bytes-other-name"
    copy.write_bytes(small.read_bytes())
    puts: list[str] = []
    for event in ("before-send.s3.PutObject", "before-send.s3.UploadPart",
                  "before-send.s3.CreateMultipartUpload"):
        store.bucket.client.meta.events.register(event, lambda request, **_: puts.append(
            request.url))
    assert await store.put_file(path) == digest
    assert await store.put_file(copy) == small_key
    assert puts == []
    assert (store.stats.uploads, store.stats.skipped_uploads) == (2, 2)
    assert sorted([key async for key in store.list_keys()]) == sorted([digest, small_key])


async def test_concurrent_callers_share_one_download(
        store: ObjectStore, store_config: ObjectStoreConfig, big_file: tuple[Path, str],
        tmp_path: Path) -> None:
    path, _ = big_file
    key = await store.put_file(path)
    reader = new_store(store_config, tmp_path / "reader-cache")
    try:
        gets = count_gets(reader)
        paths = await asyncio.gather(*(reader.get_file(key) for _ in range(10)))
        assert set(paths) == {reader.cache.path_of(key)}
        assert len(gets) == 1
        assert reader.stats.downloads == 1
        assert paths[0].read_bytes() == path.read_bytes()
    finally:
        await reader.close()
    assert reader.cache.temp_files() == []


async def test_a_changed_cached_file_is_fetched_again(
        store: ObjectStore, store_config: ObjectStoreConfig, tmp_path: Path) -> None:
    src = tmp_path / "src"
    key = random_file(src, 3 * MiB)
    await store.put_file(src)
    cached = await store.get_file(key)
    gets = count_gets(store)

    # Same size, other bytes (what a stray writer or a bad disk block would leave).
    cached.chmod(0o644)
    with open(cached, "r+b") as f:
        f.seek(MiB)
        f.write(b"\0" * 16)
    assert await store.get_file(key) == cached
    assert cached.read_bytes() == src.read_bytes()
    assert (store.stats.refetches, store.stats.downloads, len(gets)) == (1, 2, 1)

    # A restarted agent over the same cache trusts the recorded check and does not hash or
    # fetch again; one over a cache changed while it was down fetches again.
    again = new_store(store_config, store.cache.root)
    try:
        assert again.cache.is_checked(key)
        cached.chmod(0o644)
        cached.write_bytes(b"short")
        assert not again.cache.is_checked(key)
        assert (await again.get_file(key)).read_bytes() == src.read_bytes()
        assert (again.stats.refetches, again.stats.downloads) == (1, 1)
    finally:
        await again.close()


async def test_ranged_reads(store: ObjectStore, store_config: ObjectStoreConfig,
                            tmp_path: Path) -> None:
    src = tmp_path / "src"
    random_file(src, 10 * MiB + 7)
    data = src.read_bytes()
    key = await store.put_file(src)

    reader = new_store(store_config, tmp_path / "reader-cache")
    try:
        gets = count_gets(reader)
        assert await reader.read_range(key, 5 * MiB - 3, 100) == data[5 * MiB - 3:5 * MiB + 97]
        assert await reader.read_range(key, len(data) - 5, 100) == data[-5:]
        assert await reader.read_range(key, len(data), 10) == b""
        assert await reader.read_range(key, 0, 0) == b""
        assert len(gets) == 3  # ranged GETs, nothing cached
        assert reader.cache.temp_files() == []
        assert not reader.cache.path_of(key).exists()

        await reader.get_file(key)
        gets.clear()
        assert await reader.read_range(key, 123, 4567) == data[123:123 + 4567]
        assert gets == []  # from the cached file
        with pytest.raises(ValueError):
            await reader.read_range(key, -1, 10)
        with pytest.raises(ValueError):
            await reader.read_range(key, 0, 65 * MiB)
    finally:
        await reader.close()


async def test_missing_and_corrupt_objects(store: ObjectStore, tmp_path: Path) -> None:
    missing = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(ObjectNotFound):
        await store.get_file(missing)
    assert not await store.exists(missing)
    assert await store.size_of(missing) is None

    # Bytes under a key that is not theirs: never put in the cache.
    liar = hashlib.sha256(b"what the key says").hexdigest()
    await asyncio.to_thread(store.bucket.put, liar, b"something else")
    with pytest.raises(ObjectStoreError, match="holds other bytes"):
        await store.get_file(liar)
    assert not store.cache.path_of(liar).exists()

    await store.delete(liar)
    assert not await store.exists(liar)
    with pytest.raises(ValueError):
        await store.get_file("not-a-key")


async def test_delete_removes_the_object_and_the_cached_copy(
        store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    key = random_file(src, 4096)
    await store.put_file(src)
    cached = await store.get_file(key)
    await store.delete(key)
    assert not cached.exists()
    assert not await store.exists(key)
    with pytest.raises(ObjectNotFound):
        await store.get_file(key)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


@pytest.mark.timeout(60)
async def test_an_unreachable_store_is_unavailable(
        s3_env: dict[str, str], tmp_path: Path) -> None:
    config = ObjectStoreConfig.from_url(
        f"s3://pandastack/x?endpoint=http://127.0.0.1:{closed_port()}", s3_env)
    store = ObjectStore(config, tmp_path / "cache")
    src = tmp_path / "src"
    key = random_file(src, 100)
    try:
        with pytest.raises(ObjectStoreUnavailable, match="did not answer"):
            await store.put_file(src)
        with pytest.raises(ObjectStoreUnavailable):
            await store.get_file(key)
        with pytest.raises(ObjectStoreUnavailable):
            await store.exists(key)
        with pytest.raises(ObjectStoreUnavailable):
            await store.read_range(key, 0, 10)
    finally:
        await store.close()
    assert store.cache.temp_files() == []
    assert not store.cache.path_of(key).exists()

    api = from_host_error(ObjectStoreUnavailable("the object store did not answer"))
    assert (api.status, api.code, api.headers) == (503, "unavailable", {"Retry-After": "5"})


async def test_wrong_credentials_are_refused_not_unavailable(
        s3_env: dict[str, str], tmp_path: Path) -> None:
    env = {**s3_env, "PANDASTACK_S3_SECRET_KEY": "wrong"}
    config = ObjectStoreConfig.from_url(f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/x", env)
    store = ObjectStore(config, tmp_path / "cache")
    try:
        with pytest.raises(ObjectStoreError) as info:
            await store.exists(hashlib.sha256(b"x").hexdigest())
        assert not isinstance(info.value, ObjectStoreUnavailable)
    finally:
        await store.close()


async def test_closing_stops_a_download_and_leaves_no_temp_file(
        store: ObjectStore, store_config: ObjectStoreConfig, big_file: tuple[Path, str],
        tmp_path: Path) -> None:
    path, _ = big_file
    key = await store.put_file(path)
    reader = new_store(store_config, tmp_path / "reader-cache")
    real_download = reader.bucket.download
    started, resume = threading.Event(), threading.Event()

    def held_download(key: str, out: Any, seen: Any) -> int:
        def first_chunk_waits(chunk: bytes) -> None:
            started.set()
            resume.wait(30)
            seen(chunk)
        return real_download(key, out, first_chunk_waits)

    reader.bucket.download = held_download  # type: ignore[method-assign]
    fetch = asyncio.create_task(reader.get_file(key))
    assert await asyncio.to_thread(started.wait, 30)
    assert reader.cache.temp_files() != []  # mid-download
    closing = asyncio.create_task(reader.close())
    await asyncio.sleep(0)
    resume.set()
    await closing
    with pytest.raises(TransferStopped):
        await fetch
    assert reader.cache.temp_files() == []
    assert not reader.cache.path_of(key).exists()


async def test_a_file_that_changes_while_it_uploads_stores_nothing(
        store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    key = random_file(src, 20 * MiB)
    real_put_part = store.bucket.put_part

    def put_part_then_write(key: str, upload_id: str, number: int, data: bytes) -> str:
        if number == 1:
            with open(src, "r+b") as f:  # a writer not done with it yet
                f.seek(-10, os.SEEK_END)
                f.write(b"0123456789")
        return real_put_part(key, upload_id, number, data)

    store.bucket.put_part = put_part_then_write  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="changed while it was uploaded"):
        await store.put_file(src)
    assert not await store.exists(key)
    assert [k async for k in store.list_keys()] == []
    assert store.stats.uploads == 0
