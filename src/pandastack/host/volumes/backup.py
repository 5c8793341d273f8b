"""Volume backups in the object store the hosts share (ADR 0027, "Portable volumes").

A backup is the volume's image as a chunked file (holes not sent, chunks the store has not
sent again) under `manifests/volumes/<backup id>.json`. It holds no VMM state, so any host
of the store can restore it, whatever its VMM. The image is first copied aside (a sparse
copy, or a reflink) so that the volume is free again at once and the upload reads a file
nobody writes; a volume with a read-write user is refused: its guest's page cache holds
what the image does not.

A move (driven by the control plane) is a backup here, a restore on the other host under
the same volume id, and a delete here; a restore of the backup it made already is a no-op,
so a retried move goes on where it stopped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pandastack.host.runtime.remote import RemoteState
from pandastack.host.volumes.attach import HostVolumes
from pandastack.host.volumes.store import IMAGE, VolumeFiles, copy_image
from pandastack.hostport.errors import NoObjectStore, VolumeInUse, VolumeNotFound
from pandastack.hostport.volumes import HostVolume, VolumeBackup
from pandastack.rules import VOLUME_BACKUP_ID_RE

KIND = "volume"


def backup_manifest(backup_id: str) -> str:
    return f"volumes/{backup_id}.json"


def stored_bytes(ref: dict[str, Any]) -> int:
    """What a chunked file's data takes in the store (its chunks of zeros take nothing)."""
    size, chunk = int(ref["size"]), int(ref["chunk_size"])
    return sum(min(chunk, size - i * chunk) for i, key in enumerate(ref["chunks"]) if key)


class VolumeBackups:
    def __init__(self, volumes: HostVolumes, remote: RemoteState | None) -> None:
        self.volumes = volumes
        self.remote = remote

    def _store(self) -> RemoteState:
        if self.remote is None:
            raise NoObjectStore("this host has no object store (PANDASTACK_OBJECT_STORE): "
                                "volume snapshots and moves need one")
        return self.remote

    @staticmethod
    def _check_id(backup_id: str) -> None:
        if not VOLUME_BACKUP_ID_RE.match(backup_id):
            raise VolumeNotFound(f"backup {backup_id}")

    async def backup(self, volume_id: str, backup_id: str) -> VolumeBackup:
        self._check_id(backup_id)
        remote = self._store()
        files = await asyncio.to_thread(self.volumes.store.get, volume_id)
        image = self.volumes.store.image(volume_id)
        aside = await asyncio.to_thread(self.volumes.store.begin, volume_id)
        try:
            with self.volumes.reading(volume_id):
                await asyncio.to_thread(copy_image, image, aside / IMAGE)
            ref = await remote.put_file(aside / IMAGE, IMAGE)
        finally:
            self.volumes.store.abort(aside)
        made = VolumeBackup(id=backup_id, volume_id=volume_id, size_mb=files.size_mb,
                            stored_bytes=stored_bytes(ref), created_at=time.time())
        # Last: a manifest names only chunks the store holds.
        await remote.put_document(backup_manifest(backup_id), {
            "kind": KIND, "id": backup_id, "volume_id": volume_id,
            "size_bytes": files.size_bytes, "created_at": made.created_at, "image": ref})
        return made

    async def restore(self, backup_id: str, volume_id: str) -> HostVolume:
        self._check_id(backup_id)
        remote = self._store()
        store = self.volumes.store
        try:
            have = await asyncio.to_thread(store.get, volume_id)
        except VolumeNotFound:
            have = None
        if have is not None:
            if have.restored_from == backup_id:
                return self.volumes.info(have)  # a retried move
            raise VolumeInUse(f"this host has a volume {volume_id} already")
        document = await remote.document(backup_manifest(backup_id), KIND)
        if document is None:
            raise VolumeNotFound(f"backup {backup_id}")
        work = await asyncio.to_thread(store.begin, volume_id)
        try:
            await remote.copy_file(document["image"], work / IMAGE)
        except BaseException:
            store.abort(work)
            raise
        source = str(document["volume_id"])
        files = await asyncio.to_thread(store.commit, work, VolumeFiles(
            volume_id, int(document["size_bytes"]), time.time(),
            source=None if source == volume_id else source, restored_from=backup_id))
        return self.volumes.info(files)

    async def delete(self, backup_id: str) -> None:
        self._check_id(backup_id)
        await self._store().delete_manifest(backup_manifest(backup_id))
