"""Manifests (named objects that are replaced and deleted), known keys and sparse downloads,
against the real S3 server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pandastack.host.objects import ObjectStore, ObjectStoreConfig

MiB = 1 << 20


async def test_a_manifest_is_written_replaced_read_and_deleted(store: ObjectStore) -> None:
    assert await store.get_manifest("snapshots/snap-000000000001.json") is None
    await store.put_manifest("snapshots/snap-000000000001.json", b'{"v": 1}')
    await store.put_manifest("snapshots/snap-000000000001.json", b'{"v": 2}')
    assert await store.get_manifest("snapshots/snap-000000000001.json") == b'{"v": 2}'
    # Not among the content-addressed objects.
    assert [key async for key in store.list_keys()] == []
    await store.delete_manifest("snapshots/snap-000000000001.json")
    assert await store.get_manifest("snapshots/snap-000000000001.json") is None
    await store.delete_manifest("snapshots/snap-000000000001.json")  # gone already: no error
    assert (store.stats.manifest_writes, store.stats.manifest_reads) == (2, 3)


@pytest.mark.parametrize("name", ["../escape", "/abs", "UPPER", "", "a/../b"])
async def test_manifest_names_stay_under_the_prefix(store: ObjectStore, name: str) -> None:
    with pytest.raises(ValueError):
        await store.put_manifest(name, b"{}")


async def test_a_download_keeps_zeros_as_holes_and_a_known_key_skips_hashing(
        store: ObjectStore, store_config: ObjectStoreConfig, tmp_path: Path) -> None:
    path = tmp_path / "disk.img"
    with open(path, "wb") as f:  # 24 MiB of which 1 MiB is data, ending in a hole
        f.seek(8 * MiB)
        f.write(os.urandom(MiB))
        f.truncate(24 * MiB)
    key = await store.put_file(path)
    other = ObjectStore(store_config, tmp_path / "other-cache")
    try:
        cached = await other.get_file(key)
        assert cached.read_bytes() == path.read_bytes()
        assert cached.stat().st_blocks * 512 <= 2 * MiB  # the zeros were not written
        # The caller vouches for the key (it hashed this file before): the store has it, so
        # nothing is hashed or sent.
        assert await other.put_file(path, key=key) == key
        assert (other.stats.skipped_uploads, other.stats.uploads) == (1, 0)
    finally:
        await other.close()


async def test_manifest_formats_1_and_2_are_read_others_refused(
        store: ObjectStore, tmp_path: Path) -> None:
    import json

    from pandastack.host.runtime.remote import RemoteState
    from pandastack.hostport.errors import SetupError

    remote = RemoteState(store, tmp_path / "templates", disks=lambda: None,  # type: ignore
                         driver_identity=lambda: "vmm|tcg", progress=lambda m: None)
    whole = tmp_path / "whole"
    whole.write_bytes(os.urandom(3 * MiB))
    key = await store.put_file(whole)  # how format 1 stored every file
    for fmt in (1, 2):
        await store.put_manifest(f"snapshots/snap-00000000000{fmt}.json", json.dumps(
            {"format": fmt, "kind": "snapshot", "driver": "vmm|tcg"}).encode())
        document = await remote._manifest(f"snapshots/snap-00000000000{fmt}.json", "snapshot")
        assert document is not None and document["format"] == fmt
    await remote._link({"name": "whole", "key": key, "size": 3 * MiB}, tmp_path / "linked")
    assert (tmp_path / "linked").read_bytes() == whole.read_bytes()

    await store.put_manifest("snapshots/snap-000000000003.json", json.dumps(
        {"format": 3, "kind": "snapshot", "driver": "vmm|tcg"}).encode())
    with pytest.raises(SetupError, match="format 3; this host reads formats 1, 2"):
        await remote._manifest("snapshots/snap-000000000003.json", "snapshot")
