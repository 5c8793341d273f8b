"""Snapshots and hibernated sandboxes in the object store, so that any host sharing the store
can restore them (ADR 0020).

A snapshot that is kept (not a fork's transient one) is published when it is committed: its
stream, its frozen disk layers and what a host without its template needs (the template's
disk and every file below it, kernel, initrd), each under its content key, then a manifest
`manifests/snapshots/<snapshot id>.json` naming them. A hibernation publishes the same for the
sandbox, with what its record needs, under `manifests/sandboxes/<sandbox id>.json`.

A host that lacks a snapshot or sandbox reads its manifest, fetches the files through the
per-host cache and lays them out as if it had made them: a snapshot directory, or a sandbox
directory with its record. The chain's bottom is the only host path in a chain (the oldest
layer names the template disk absolutely, the disk names the rootfs absolutely): the fetching
host copies those two files out of the cache and names its own copies of their parents in
them (`DiskLayers.rebase`, the header only). Every other file is a hard link to the cached one.

Format 2 stores every file as chunks (objects/chunks.py): a reference names the file's chunk
list (its key, size, chunk size and each chunk's key, or None for zeros), so holes are never
sent and chunks the store has (another file, an earlier snapshot) are not sent again. Format 1
manifests (each file one object under its sha256) are still read.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.host.config import HostConfig
from pandastack.host.network.manager import Slot
from pandastack.host.objects.chunks import ChunkList
from pandastack.host.runtime.records import HIBERNATION, SandboxRecord
from pandastack.host.runtime.slots import SandboxSlots
from pandastack.host.runtime.snapshots import STREAM, SnapshotStore, allocated_bytes
from pandastack.host.vmm.driver import DiskLayers, VMMDriver
from pandastack.hostport.errors import SandboxNotFound, SetupError
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.results import SnapshotInfo

if TYPE_CHECKING:
    from pandastack.host.objects.store import ObjectStore

FORMAT = 2
READ_FORMATS = (1, 2)
MiB = 1 << 20
KERNEL = "vmlinux"
INITRD = "initrd.img"
# Record fields a sandbox keeps across hosts (the rest is this host's: paths, pid, slot).
SANDBOX_FIELDS = ("template", "template_key", "vcpus", "memory_mb", "disk_bytes", "hostname",
                  "machine_id", "created_at", "layers", "snapshot", "network")

Progress = Callable[[str], None]
# {"name": file name here, "key": content key, "size": bytes}, and in format 2 the chunk
# list: "chunk_size", "chunks" (each chunk's key or None); "key" is then the list's key.
Ref = dict[str, Any]


def snapshot_manifest(snapshot_id: str) -> str:
    return f"snapshots/{snapshot_id}.json"


def sandbox_manifest(sandbox_id: str) -> str:
    return f"sandboxes/{sandbox_id}.json"


def open_remote(config: HostConfig, driver: Callable[[], VMMDriver],
                progress: Progress) -> RemoteState:
    """The runtime's side of the store `config` names (which it must)."""
    from pandastack.host.objects.store import ObjectStore  # boto3: only where a store is

    assert config.object_store is not None
    limit = None if config.objects_cache_mb is None else config.objects_cache_mb * MiB
    store = ObjectStore(config.object_store, config.objects_cache_dir, limit)
    return RemoteState(store, config.fetched_templates_dir, lambda: driver().disks,
                       lambda: driver().identity(), progress)


async def fetch_hibernated(remote: RemoteState, slots: SandboxSlots,
                           workdir: Path) -> SandboxRecord:
    """The sandbox hibernated (on another host) whose id is `workdir`'s name, laid out in
    `workdir` (made here) with a network slot of this host; its record, not yet saved.
    SandboxNotFound where the store has no such sandbox. Nothing is left on a failure."""
    document = await remote.sandbox_document(workdir.name)
    if document is None:
        raise SandboxNotFound(workdir.name)
    policy = await asyncio.to_thread(NetworkPolicy.from_dict, document["record"]["network"])
    workdir.mkdir(mode=0o700, parents=True, exist_ok=False)
    slot: Slot | None = None
    try:
        slot = await slots.acquire(workdir, policy)
        fields = await remote.fetch_sandbox(document, workdir)
        writer = await remote.take_over_sandbox(document)
        return SandboxRecord(id=workdir.name, **fields, state="hibernated", pid=None,
                             slot=slot.index if slot is not None else None, in_store=True,
                             store_writer=writer)
    except BaseException:
        if slot is not None:
            await slots.release(slot)
        await asyncio.to_thread(shutil.rmtree, workdir, True)
        raise


class RemoteState:
    """Publishes to, and fetches from, one object store for one runtime."""

    def __init__(self, store: ObjectStore, templates_dir: Path, disks: Callable[[], DiskLayers],
                 driver_identity: Callable[[], str], progress: Progress) -> None:
        """`templates_dir`: where templates fetched from the store are laid out (one
        directory per template disk content)."""
        self.store = store
        self.templates_dir = templates_dir
        self._disks = disks
        self._identity = driver_identity
        self.progress = progress
        # (device, inode, size, mtime) -> chunk list: published files never change, and
        # reading a rootfs again for every snapshot would cost seconds.
        self._keys: dict[tuple[int, int, int, int], ChunkList] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def close(self) -> None:
        await self.store.close()

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    # -- publishing -----------------------------------------------------------------------

    async def _put(self, path: Path, name: str | None = None) -> Ref:
        st = await asyncio.to_thread(os.stat, path)
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        chunks = self._keys.get(stamp)
        if chunks is None or not chunks.data_keys <= self.store.files.known:
            chunks = await self.store.files.put(path)
            self._keys[stamp] = chunks
        return {"name": name or path.name, "key": chunks.key, **chunks.to_json()}

    async def template_part(self, template_path: Path) -> dict[str, Any]:
        """The template's files put in the store (those it holds already are not sent
        again): the part of a manifest or offer that names them (`fetch_template`)."""
        meta = json.loads(await asyncio.to_thread((template_path / "template.json").read_text))
        disks = self._disks()
        # The template disk first, then each file it reads below itself (the rootfs).
        chain = await asyncio.to_thread(disks.layer_chain, template_path / f"disk{disks.suffix}")
        refs = await asyncio.gather(
            *(self._put(path) for path in chain),
            self._put(Path(meta["kernel"]), KERNEL), self._put(Path(meta["initrd"]), INITRD))
        return {"name": meta["name"], "key": meta["key"], "vcpus": meta["vcpus"],
                "memory_mb": meta["memory_mb"], "cmdline": meta["cmdline"],
                "disk_bytes": meta["disk_bytes"], "driver": meta.get("driver"),
                "image_key": meta.get("image_key"), "image": meta.get("image"),
                "chain": list(refs[:-2]), "kernel": refs[-2], "initrd": refs[-1]}

    async def _publish(self, manifest: str, body: dict[str, Any], stream: Path,
                       layers_dir: Path, layers: tuple[str, ...],
                       template_path: Path) -> dict[str, Any]:
        parts = await asyncio.gather(self._put(stream, STREAM),
                                     self.template_part(template_path),
                                     *(self._put(layers_dir / name) for name in layers))
        document = {"format": FORMAT, "driver": self._identity(), **body,
                    "stream": parts[0], "template": parts[1], "layers": list(parts[2:])}
        # Last: a manifest names only objects the store holds.
        await self.store.put_manifest(manifest, json.dumps(document, indent=1).encode())
        return document

    async def publish_snapshot(self, info: SnapshotInfo, directory: Path) -> None:
        snapshot = {k: v for k, v in asdict(info).items() if k != "template_path"}
        # The copies it keeps of read-write volumes go with it: a sandbox made of it on
        # another host gets them (read-only volumes stay on their host, which it must use).
        copies = await asyncio.gather(*(self._put(directory / str(entry["copy"]))
                                        for entry in info.volumes if "copy" in entry))
        await self._publish(snapshot_manifest(info.id), {"kind": "snapshot",
                                                         "snapshot": snapshot,
                                                         "volume_copies": list(copies)},
                            directory / STREAM, directory, info.layers, Path(info.template_path))

    async def publish_sandbox(self, record: SandboxRecord, workdir: Path) -> str:
        """Publishes the hibernated sandbox; the writer token its manifest carries."""
        fields = {name: getattr(record, name) for name in SANDBOX_FIELDS}
        writer = secrets.token_hex(8)
        await self._publish(sandbox_manifest(record.id), {"kind": "sandbox", "id": record.id,
                                                          "record": fields, "writer": writer},
                            workdir / HIBERNATION, workdir, record.layers,
                            Path(record.template_path))
        return writer

    async def take_over_sandbox(self, document: dict[str, Any]) -> str:
        """Puts the manifest back under a new writer token (this host's from now on), so
        that the host it came from no longer deletes it when it drops its own copy (a
        drain, or a fenced host coming back); the token."""
        writer = secrets.token_hex(8)
        await self.store.put_manifest(sandbox_manifest(document["id"]), json.dumps(
            {**document, "writer": writer}, indent=1).encode())
        return writer

    async def delete_sandbox_manifest(self, sandbox_id: str, writer: str | None) -> None:
        """Deletes the sandbox's manifest; with `writer`, only while it carries that token."""
        if writer is not None:
            document = await self.sandbox_document(sandbox_id)
            if document is None or document.get("writer", "") != writer:
                return
        await self.store.delete_manifest(sandbox_manifest(sandbox_id))

    # -- fetching -------------------------------------------------------------------------

    async def _manifest(self, name: str, kind: str, *,
                        vmm_state: bool = True) -> dict[str, Any] | None:
        """The manifest, checked: format, kind, and with `vmm_state` (a memory stream in
        it) that this host's VMM wrote it."""
        raw = await self.store.get_manifest(name)
        if raw is None:
            return None
        document: dict[str, Any] = json.loads(raw)
        if document.get("format") not in READ_FORMATS:
            raise SetupError(f"{name} in the object store has manifest format "
                             f"{document.get('format')!r}; this host reads formats "
                             f"{', '.join(map(str, READ_FORMATS))} (a newer pandastack wrote it)")
        if document.get("kind") != kind:
            raise SetupError(f"{name} in the object store is not a {kind} manifest")
        here = self._identity()
        if vmm_state and document.get("driver") != here:
            # The stream is the VMM's own: another VMM version or accelerator cannot load it.
            raise SetupError(f"{name} was saved by {document.get('driver')!r}; this host runs "
                             f"{here!r}")
        return document

    async def _link(self, ref: Ref, dest: Path) -> None:
        """The cached object as `dest`, a hard link (read-only: it is the cache's file)."""
        if "chunks" in ref:
            cached = await self.store.files.materialise(ChunkList.from_json(ref))
        else:  # format 1: the file is one object
            cached = await self.store.get_file(ref["key"])
        await asyncio.to_thread(_link_or_copy, cached, dest)

    async def _copy(self, ref: Ref, dest: Path) -> None:
        """A writable copy of the object as `dest`."""
        if "chunks" in ref:
            await self.store.files.write_to(ChunkList.from_json(ref), dest)
        else:
            await self.store.get_file(ref["key"], dest)

    async def fetch_template(self, part: dict[str, Any]) -> Path:
        """The template directory for a manifest's template part, laid out once per host from
        the store: the disk (its parent renamed to this directory's copy), the files below it,
        kernel, initrd and a template.json naming them."""
        chain: list[Ref] = part["chain"]
        final: Path = self.templates_dir / str(chain[0]["key"])[:32]
        async with self._lock(str(final)):
            if (final / "template.json").exists():
                return final
            disks = self._disks()
            work = final.with_name(f".{final.name}.{os.getpid()}.tmp")
            await asyncio.to_thread(shutil.rmtree, work, True)
            work.mkdir(parents=True, mode=0o700)
            try:
                names = [f"disk{disks.suffix}",
                         *(f"backing-{i}{Path(ref['name']).suffix}"
                           for i, ref in enumerate(chain[1:], 1))]
                last = len(chain) - 1
                await asyncio.gather(
                    *(self._link(ref, work / names[i]) if i == last
                      else self._copy(ref, work / names[i]) for i, ref in enumerate(chain)),
                    self._link(part["kernel"], work / KERNEL),
                    self._link(part["initrd"], work / INITRD))
                for i in range(last):
                    await asyncio.to_thread(disks.rebase, work / names[i], work / names[i + 1])
                meta = {k: part[k] for k in ("name", "key", "vcpus", "memory_mb", "cmdline",
                                             "disk_bytes", "driver", "image_key", "image")}
                meta |= {"kernel": str(final / KERNEL), "initrd": str(final / INITRD),
                         "fetched_from_store": True}
                (work / "template.json").write_text(json.dumps(meta, indent=2))
                try:
                    os.replace(work, final)
                except OSError as exc:
                    # Another process sharing this directory laid it out first: the same.
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    await asyncio.to_thread(shutil.rmtree, work, True)
                    return final
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, work, True)
                raise
            self.progress(f"template {part['name']} fetched from the object store to {final}")
            return final

    async def fetch_layers(self, layers: list[Ref], directory: Path, template: Path, *,
                      writable_top: bool) -> None:
        """The layers in `directory`: the oldest a copy whose parent is now this host's
        template disk, the top a copy too where the VM will write to it, the rest links."""
        disks = self._disks()
        last = len(layers) - 1
        await asyncio.gather(*(
            self._copy(ref, directory / ref["name"]) if i == 0 or (writable_top and i == last)
            else self._link(ref, directory / ref["name"]) for i, ref in enumerate(layers)))
        await asyncio.to_thread(disks.rebase, directory / layers[0]["name"],
                                template / f"disk{disks.suffix}")

    async def fetch_snapshot(self, snapshot_id: str, snapshots: SnapshotStore) -> bool:
        """Lays out the snapshot from the store in `snapshots`; False where the store has no
        such snapshot either."""
        async with self._lock(snapshot_id):
            if snapshots.path(snapshot_id).exists():
                return True
            document = await self._manifest(snapshot_manifest(snapshot_id), "snapshot")
            if document is None:
                return False
            template = await self.fetch_template(document["template"])
            work = snapshots.begin(snapshot_id)
            try:
                # Volume copies as copies, not links: a one-child fork's child may take a
                # snapshot's copy as its own volume, and must not write into the cache.
                await asyncio.gather(self._link(document["stream"], work / STREAM),
                                     self.fetch_layers(document["layers"], work, template,
                                                  writable_top=False),
                                     *(self._copy(ref, work / ref["name"])
                                       for ref in document.get("volume_copies", ())))
                data = dict(document["snapshot"])
                data["layers"] = tuple(data["layers"])
                data |= {"template_path": str(template), "size_bytes": allocated_bytes(work)}
                info = SnapshotInfo(**data)
                snapshots.commit(work, info)
            except BaseException:
                snapshots.abort(work)
                raise
        await self.store.evict()  # after the links: what this snapshot uses stays
        return True

    async def sandbox_document(self, sandbox_id: str) -> dict[str, Any] | None:
        return await self._manifest(sandbox_manifest(sandbox_id), "sandbox")

    async def fetch_sandbox(self, document: dict[str, Any], workdir: Path) -> dict[str, Any]:
        """Lays out a hibernated sandbox's files in `workdir` (which exists, empty); the
        record's fields (SANDBOX_FIELDS and template_path) for this host."""
        template = await self.fetch_template(document["template"])
        await asyncio.gather(self._link(document["stream"], workdir / HIBERNATION),
                             self.fetch_layers(document["layers"], workdir, template,
                                          writable_top=True))
        fields = dict(document["record"])
        fields["layers"] = tuple(fields["layers"])
        await self.store.evict()
        return {**fields, "template_path": str(template)}

    # -- single files (volume backups) -----------------------------------------------------

    async def put_file(self, path: Path, name: str) -> Ref:
        """The file in the store (chunked: holes and known chunks not sent); its reference."""
        return await self._put(path, name)

    async def copy_file(self, ref: Ref, dest: Path) -> None:
        """A writable copy of a stored file as `dest`."""
        await self._copy(ref, dest)

    async def put_document(self, name: str, document: dict[str, Any]) -> None:
        await self.store.put_manifest(name, json.dumps({"format": FORMAT, **document},
                                                       indent=1).encode())

    async def document(self, name: str, kind: str) -> dict[str, Any] | None:
        """A manifest that holds no VMM state (any host may read it); None if absent."""
        return await self._manifest(name, kind, vmm_state=False)

    # -- deleting -------------------------------------------------------------------------

    def delete_manifest_blocking(self, name: str) -> bool:
        """Deletes the manifest; whether there was one (blocking: for synchronous callers,
        which run in a thread)."""
        if self.store.bucket.get_manifest(name) is None:
            return False
        self.store.bucket.delete_manifest(name)
        return True

    async def delete_manifest(self, name: str) -> None:
        await self.store.delete_manifest(name)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        subprocess.run(["cp", "--reflink=auto", "--sparse=always", str(src), str(dest)],
                       check=True)
