"""Volume backups on the real S3 server and real ext4 images (no VM): what a backup stores
(not the holes), a restore on another host's volume root byte for byte, a retried restore,
and the refusals: a writer, a copy under way, an id taken, an unknown backup, no store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pandastack.host.objects import ObjectStore
from pandastack.host.runtime.remote import RemoteState
from pandastack.host.vmm.driver import DiskLayers
from pandastack.host.volumes.attach import HostVolumes, Mounted
from pandastack.host.volumes.backup import VolumeBackups, backup_manifest
from pandastack.host.volumes.store import VolumeStore
from pandastack.hostport.errors import NoObjectStore, VolumeInUse, VolumeNotFound
from pandastack.hostport.volumes import VolumeMountRequest
from pandastack.rules import new_volume_backup_id, new_volume_id

MiB = 1 << 20


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_disks() -> DiskLayers:
    raise AssertionError("volume backups read no template disks")


def remote_of(store: ObjectStore, tmp: Path) -> RemoteState:
    return RemoteState(store, tmp / "templates", disks=no_disks,
                       driver_identity=lambda: "vmm|tcg", progress=lambda m: None)


async def test_backup_and_restore_on_another_volume_root(store: ObjectStore,
                                                         tmp_path: Path) -> None:
    users: list[tuple[str, tuple[Mounted, ...]]] = []
    here = HostVolumes(VolumeStore(tmp_path / "a"), lambda: users, progress=lambda m: None)
    there = HostVolumes(VolumeStore(tmp_path / "b"), lambda: [], progress=lambda m: None)
    remote = remote_of(store, tmp_path)
    vid = new_volume_id()
    await here.create(vid, 64)
    image = here.store.image(vid)
    with open(image, "r+b") as f:  # data past the file system's metadata, as a guest writes
        f.seek(40 * MiB)
        f.write(b"\x5a" * MiB)

    users.append(("sbx-writer", (Mounted(0, vid, "/data", False),)))
    backups = VolumeBackups(here, remote)
    with pytest.raises(VolumeInUse):
        await backups.backup(vid, new_volume_backup_id())
    users.clear()

    bid = new_volume_backup_id()
    made = await backups.backup(vid, bid)
    assert (made.id, made.volume_id, made.size_mb) == (bid, vid, 64)
    assert MiB <= made.stored_bytes < 32 * MiB  # the written MiB and the metadata's chunks
    assert [p.name for p in (tmp_path / "a").iterdir()] == [vid]  # the copy aside is gone

    restored = await VolumeBackups(there, remote).restore(bid, vid)
    assert (restored.id, restored.size_mb, restored.source) == (vid, 64, None)
    assert digest(there.store.image(vid)) == digest(image)
    # A retried move: the same backup again is the volume it made; another is refused.
    assert (await VolumeBackups(there, remote).restore(bid, vid)).id == vid
    with pytest.raises(VolumeInUse):
        await VolumeBackups(there, remote).restore(new_volume_backup_id(), vid)
    # A new id elsewhere names the volume it came from.
    other = new_volume_id()
    assert (await VolumeBackups(there, remote).restore(bid, other)).source == vid

    await backups.delete(bid)
    assert await store.get_manifest(backup_manifest(bid)) is None
    with pytest.raises(VolumeNotFound):
        await VolumeBackups(there, remote).restore(bid, new_volume_id())
    with pytest.raises(VolumeNotFound):
        await backups.restore("../../etc", new_volume_id())


async def test_a_copy_under_way_keeps_writers_out_and_no_store_is_clear(
        tmp_path: Path) -> None:
    volumes = HostVolumes(VolumeStore(tmp_path / "v"), lambda: [], progress=lambda m: None)
    vid = new_volume_id()
    await volumes.create(vid, 16)
    with volumes.reading(vid):
        with pytest.raises(VolumeInUse):
            volumes.plan("sbx-w", [VolumeMountRequest(vid, "/data")], 4)
        volumes.plan("sbx-r", [VolumeMountRequest(vid, "/data", read_only=True)], 4)
    volumes.settle("sbx-r")
    volumes.plan("sbx-w", [VolumeMountRequest(vid, "/data")], 4)  # free again
    with pytest.raises(NoObjectStore):
        await VolumeBackups(volumes, None).backup(vid, new_volume_backup_id())
