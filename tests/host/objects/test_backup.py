"""An object store backup to a directory and its restore (host/objects/backup.py), against
the session's real S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from pandastack.host.objects import ObjectStore, ObjectStoreConfig
from pandastack.host.objects.backup import (
    backup_objects,
    backup_store,
    restore_objects,
)

MiB = 1 << 20


async def stored_file(store: ObjectStore, path: Path, size: int) -> str:
    path.write_bytes(os.urandom(size))
    return await store.put_file(path)


async def wipe(store: ObjectStore) -> None:
    """Every object and manifest of the store's prefix removed: the store lost."""
    keys, after = store.bucket.list_page(None)
    while True:
        for key in keys:
            store.bucket.delete(key)
        if after is None:
            break
        keys, after = store.bucket.list_page(after)
    for name in store.bucket.list_manifests(""):
        store.bucket.delete_manifest(name)


async def test_a_backup_restores_a_lost_store_and_the_next_one_fetches_only_whats_new(
        store: ObjectStore, store_config: ObjectStoreConfig, tmp_path: Path) -> None:
    small = await stored_file(store, tmp_path / "small", 3000)
    large = await stored_file(store, tmp_path / "large", 9 * MiB + 7)  # multipart (8 MiB)
    store.bucket.put_manifest("snapshots/team-a/snap-1", json.dumps(
        {"memory": large, "disk": {"chunks": [small]}}).encode())
    store.bucket.put_manifest("volumes/vol-1", b'{"image": "' + small.encode() + b'"}')

    target = tmp_path / "backup"
    copy = backup_store(target, store_config)
    try:
        counts = await backup_objects(copy, target)
        assert (counts.objects, counts.fetched, counts.manifests, counts.missing) == \
            (2, 2, 2, [])
        assert stat.S_IMODE(target.stat().st_mode) == 0o700  # guest memory and disks
        info = json.loads((target / "backup.json").read_text())
        assert info["objects"] == 2 and info["manifests"] == 2

        # An object stored since: the next backup into the same directory fetches it alone.
        newer = await stored_file(store, tmp_path / "newer", 1000)
        gets_before = _gets(copy)
        again = await backup_objects(copy, target)
        assert (again.objects, again.fetched) == (3, 1)
        assert gets_before == [newer]  # the two others were checked on disk, not fetched
    finally:
        await copy.close()

    await wipe(store)
    assert store.bucket.list_page(None) == ([], None)
    restorer = backup_store(target, store_config)
    try:
        restored = await restore_objects(restorer, target)
    finally:
        await restorer.close()
    assert (restored.objects, restored.manifests) == (3, 2)

    # What a host on another machine reads back: the same bytes under the same names.
    fresh = ObjectStore(store_config, tmp_path / "other-host-cache")
    try:
        for key, name in ((small, "small"), (large, "large"), (newer, "newer")):
            got = await fresh.get_file(key)
            assert hashlib.sha256(got.read_bytes()).hexdigest() == key
            assert got.read_bytes() == (tmp_path / name).read_bytes()
        assert json.loads(fresh.bucket.get_manifest("snapshots/team-a/snap-1") or b"") == \
            {"memory": large, "disk": {"chunks": [small]}}
        assert sorted(fresh.bucket.list_manifests("")) == ["snapshots/team-a/snap-1",
                                                            "volumes/vol-1"]
    finally:
        await fresh.close()


def _gets(store: ObjectStore) -> list[str]:
    """The keys of the content object GETs `store` makes from now on (not manifests')."""
    seen: list[str] = []

    def record(request: object, **_: object) -> None:
        url = str(getattr(request, "url", ""))
        if "/sha256/" in url:
            seen.append(url.rsplit("/", 1)[-1])
    store.bucket.client.meta.events.register("before-send.s3.GetObject", record)
    return seen


async def test_a_manifest_naming_a_lost_object_is_reported_and_a_damaged_backup_refused(
        store: ObjectStore, store_config: ObjectStoreConfig, tmp_path: Path) -> None:
    kept = await stored_file(store, tmp_path / "kept", 2000)
    gone = "ab" * 32
    store.bucket.put_manifest("snapshots/s", json.dumps({"a": kept, "b": gone}).encode())
    target = tmp_path / "backup"
    copy = backup_store(target, store_config)
    try:
        counts = await backup_objects(copy, target)
    finally:
        await copy.close()
    assert counts.missing == [gone]

    # One flipped byte in the backup: the restore names the file and puts back nothing.
    damaged = next(p for p in (target / "objects").rglob(kept))
    damaged.chmod(0o600)
    data = bytearray(damaged.read_bytes())
    data[10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    await wipe(store)
    restorer = backup_store(target, store_config)
    try:
        with pytest.raises(ValueError, match="does not hold the bytes"):
            await restore_objects(restorer, target)
    finally:
        await restorer.close()
    assert store.bucket.list_page(None) == ([], None)
    assert store.bucket.list_manifests("") == []


async def test_a_directory_without_a_backup_is_refused(
        store_config: ObjectStoreConfig, tmp_path: Path) -> None:
    empty = tmp_path / f"nothing-{uuid.uuid4().hex[:6]}"
    restorer = backup_store(empty, store_config)
    try:
        with pytest.raises(ValueError, match="holds no object store backup"):
            await restore_objects(restorer, empty)
    finally:
        await restorer.close()
