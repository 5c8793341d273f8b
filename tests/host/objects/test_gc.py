"""Garbage collection of the store (objects/gc.py) on the real S3 server."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pandastack.host.objects import ObjectStore
from pandastack.host.objects.chunks import CHUNK_SIZE
from pandastack.host.objects.gc import collect_garbage
from pandastack.hostport.errors import ObjectStoreError


async def test_only_old_objects_no_manifest_names_are_deleted(
        store: ObjectStore, tmp_path: Path) -> None:
    shared = os.urandom(CHUNK_SIZE)
    kept_src, dropped_src, whole_src = tmp_path / "kept", tmp_path / "dropped", tmp_path / "w"
    kept_src.write_bytes(shared + os.urandom(CHUNK_SIZE))
    dropped_src.write_bytes(shared + os.urandom(CHUNK_SIZE))  # shares its first chunk
    whole_src.write_bytes(os.urandom(1000))
    kept, dropped = await store.files.put(kept_src), await store.files.put(dropped_src)
    whole = await store.put_file(whole_src)  # a format 1 manifest's object
    document = {"format": 2, "kind": "snapshot",
                "stream": {"name": "state.stream", "key": kept.key, **kept.to_json()},
                "template": {"key": "e01aeba53becc0f22b30", "chain": [
                    {"name": "rootfs.img", "key": whole, "size": 1000}]}}
    await store.put_manifest("snapshots/snap-000000000001.json", json.dumps(document).encode())
    before = {key async for key in store.list_keys()}
    assert before == kept.data_keys | dropped.data_keys | {whole}

    young = await collect_garbage(store, grace_s=3600)
    assert young.deleted == [] and young.kept_young == 1  # just written: maybe a publish
    report = await collect_garbage(store, grace_s=3600, now=time.time() + 7200)
    assert report.deleted == [dropped.chunks[1]]
    assert {key async for key in store.list_keys()} == kept.data_keys | {whole}

    # A manifest that cannot be read: nothing is deleted.
    await store.put_manifest("snapshots/snap-000000000002.json", b"{not json")
    await store.delete_manifest("snapshots/snap-000000000001.json")
    with pytest.raises(ObjectStoreError, match="partial knowledge"):
        await collect_garbage(store, grace_s=0, now=time.time() + 7200)
    assert {key async for key in store.list_keys()} == kept.data_keys | {whole}
