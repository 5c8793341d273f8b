"""Volumes mounted in a host's sandboxes (ADR 0027): which slot each one takes, what backs
the slots at a restore, the mounts in a new guest, and the copies that a snapshot keeps and a
sandbox made from it gets.

The host holds the line on writers as well as the control plane: a volume has one read-write
user, or any number of read-only ones, counting every sandbox of this host that has it
(hibernated ones too: their memory still has it mounted). QEMU's image locks hold the same
line once more, between VMMs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.host.agentlink.client import AgentClient
from pandastack.host.vmm.driver import (
    VMMDriver,
    VMProcess,
    VolumeDrive,
    volume_serial,
)
from pandastack.host.volumes.store import VolumeFiles, VolumeStore, copy_image
from pandastack.hostport.errors import VolumeInUse, VolumeNotFound
from pandastack.hostport.volumes import HostVolume, VolumeMountRequest
from pandastack.rules import clone_volume_id

if TYPE_CHECKING:  # the runtime imports this module
    from pandastack.host.runtime.sandbox import SandboxHandle

# How long a kill or hibernation waits for the guest to write out its volumes.
FLUSH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Mounted:
    """One volume a sandbox has in a slot (kept in its record as a dict)."""

    slot: int
    volume_id: str
    mount_path: str
    read_only: bool

    @classmethod
    def of(cls, data: dict[str, Any]) -> Mounted:
        return cls(int(data["slot"]), str(data["volume_id"]), str(data["mount_path"]),
                   bool(data["read_only"]))

    def record(self) -> dict[str, Any]:
        return asdict(self)


def mounts_of(records: Iterable[dict[str, Any]]) -> tuple[Mounted, ...]:
    return tuple(Mounted.of(r) for r in records)


class HostVolumes:
    """`users` lists (sandbox id, its mounts) for every sandbox this host has."""

    def __init__(self, store: VolumeStore,
                 users: Callable[[], Iterable[tuple[str, Sequence[Mounted]]]],
                 progress: Callable[[str], None] = print):
        self.store = store
        self.progress = progress
        self._recorded = users
        # Mounts of creates under way, whose records are not saved yet: claimed by `plan`
        # and `from_snapshot` (no await between the check and the claim), released by
        # `settle` once the record holds them (or the create failed).
        self._claims: dict[str, tuple[Mounted, ...]] = {}
        # Snapshots (a one-child fork's) whose only sandbox takes their copies of volumes
        # as its own instead of copying them again.
        self.handed_over: set[str] = set()

    def _users(self) -> Iterable[tuple[str, Sequence[Mounted]]]:
        yield from self._recorded()
        yield from self._claims.items()

    def settle(self, sandbox_id: str) -> None:
        self._claims.pop(sandbox_id, None)

    @contextlib.contextmanager
    def reading(self, volume_id: str) -> Iterator[None]:
        """Hold the volume as a reader while its image is copied: no writer mounts it
        meanwhile (VolumeInUse if one has it now)."""
        self.check_free(volume_id, read_only=True)
        key = f"(a copy of {volume_id}, {time.monotonic_ns()})"
        self._claims[key] = (Mounted(-1, volume_id, "", True),)
        try:
            yield
        finally:
            self._claims.pop(key, None)

    # -- who has what ---------------------------------------------------------------------

    def holders(self, volume_id: str) -> list[tuple[str, bool]]:
        """(sandbox id, read-only) of each sandbox of this host that has the volume."""
        return [(sid, m.read_only) for sid, mounts in self._users() for m in mounts
                if m.volume_id == volume_id]

    def check_free(self, volume_id: str, *, read_only: bool) -> None:
        held = self.holders(volume_id)
        if not read_only and held:
            raise VolumeInUse(f"volume {volume_id} is mounted by {held[0][0]}: it has one "
                              "writer, or only readers")
        writers = [sid for sid, ro in held if not ro]
        if writers:
            raise VolumeInUse(f"volume {volume_id} is mounted read-write by {writers[0]}")

    def plan(self, sandbox_id: str, requests: Sequence[VolumeMountRequest],
             slots: int) -> tuple[Mounted, ...]:
        """Slots (of the VM's `slots`) for a new sandbox's volumes, claimed for it
        (ValueError, VolumeNotFound, VolumeInUse before anything starts)."""
        if len(requests) > slots:
            raise ValueError(f"a sandbox here mounts at most {slots} volumes")
        ids = [r.volume_id for r in requests]
        paths = [r.mount_path.rstrip("/") or "/" for r in requests]
        if len(set(ids)) != len(ids) or len(set(paths)) != len(paths):
            raise ValueError("each volume and each mount path at most once per sandbox")
        planned = []
        for slot, request in enumerate(requests):
            if not request.mount_path.startswith("/") or "\0" in request.mount_path:
                raise ValueError(f"mount path {request.mount_path!r} must be absolute")
            self.store.get(request.volume_id)  # VolumeNotFound
            self.check_free(request.volume_id, read_only=request.read_only)
            planned.append(Mounted(slot, request.volume_id, paths[slot], request.read_only))
        self._claims[sandbox_id] = tuple(planned)
        return self._claims[sandbox_id]

    def drives(self, driver: VMMDriver, workdir: Path,
               mounts: Sequence[Mounted]) -> dict[int, VolumeDrive]:
        """What backs each mounted slot: the volume's image itself for its writer; for a
        reader, an overlay of its own (made once, kept in its directory) over the image,
        which the VMM opens read-only and shared. The guest can then replay a journal a
        killed writer left, for its own view, without touching the volume."""
        drives = {}
        for m in mounts:
            image = self.store.image(m.volume_id)
            if not m.read_only:
                drives[m.slot] = VolumeDrive(image)
                continue
            overlay = workdir / f"slot{m.slot}.reader{driver.disks.suffix}"
            if not overlay.exists():
                driver.disks.create_layer(overlay, image, self.store.get(m.volume_id).size_bytes)
            drives[m.slot] = VolumeDrive(overlay, layered=True)
        return drives

    async def announce(self, driver: VMMDriver, vm: VMProcess,
                       mounts: Sequence[Mounted]) -> None:
        """In a guest restored from a template and running (its stream loaded): the
        volumes' sizes."""
        if mounts:
            await driver.announce_volumes(vm, self._sizes(mounts))

    async def mount(self, agent: AgentClient, mounts: Sequence[Mounted]) -> None:
        """Then, once the agent is initialised: mount them."""
        sizes = self._sizes(mounts)
        await asyncio.gather(*(agent.mount_volume(volume_serial(m.slot), m.mount_path,
                                                  sizes[m.slot], read_only=m.read_only)
                               for m in mounts))

    def _sizes(self, mounts: Sequence[Mounted]) -> dict[int, int]:
        return {m.slot: self.store.get(m.volume_id).size_bytes for m in mounts}

    async def flush(self, driver: VMMDriver, handle: SandboxHandle,
                    mounts: Sequence[Mounted], *, ending: bool = False) -> None:
        """Before a sandbox with read-write volumes is killed or hibernated: have its guest
        write what it holds for them (a kill is a power cut to the guest: what its page
        cache held would be lost). `ending` (a kill): freeze them instead, which also
        leaves them clean, so the next mount replays no journal. Bounded: a guest that
        does not answer is killed anyway, with what the volume has then (its journal keeps
        it consistent)."""
        vm = handle.vm
        if vm is None or not any(not m.read_only for m in mounts) or not vm.is_alive():
            return
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                if handle.state == "paused":
                    await driver.resume(vm)
                agent = await handle.agent()
                if ending:
                    await asyncio.gather(*(agent.freeze_volume(m.mount_path)
                                           for m in mounts if not m.read_only))
                else:
                    await agent.sync()
        except Exception as exc:  # the kill goes on
            self.progress(f"sandbox {handle.id}: its volumes were not flushed: {exc}")

    # -- snapshots and the sandboxes made from them ----------------------------------------

    def keep_copies(self, mounts: Sequence[Mounted], work: Path) -> tuple[dict[str, Any], ...]:
        """(With the guest stopped: its writes flushed.) Copy each read-write volume into the
        snapshot's directory; what the snapshot records of its volumes."""
        kept = []
        for m in mounts:
            entry: dict[str, Any] = {**m.record(),
                                     "size_bytes": self.store.get(m.volume_id).size_bytes}
            if not m.read_only:
                name = f"volume-{m.slot}.img"
                copy_image(self.store.image(m.volume_id), work / name)
                entry["copy"] = name
            kept.append(entry)
        return tuple(kept)

    def from_snapshot(self, snapshot_dir: Path, recorded: Sequence[dict[str, Any]],
                      sandbox_id: str, *, take: bool = False) -> tuple[Mounted, ...]:
        """The mounts of a sandbox made from a snapshot: a new volume (its own copy of the
        snapshot's; with `take`, the snapshot's copy itself) for each read-write one, the
        same volume for each read-only one."""
        made: list[str] = []
        mounts: list[Mounted] = []
        try:
            for entry in recorded:
                m = Mounted.of(entry)
                if m.read_only:
                    self.store.get(m.volume_id)
                    self.check_free(m.volume_id, read_only=True)
                    mounts.append(m)
                    continue
                clone = clone_volume_id(m.volume_id, sandbox_id)
                self.store.copy(snapshot_dir / str(entry["copy"]), clone,
                                int(entry["size_bytes"]), m.volume_id, take=take)
                made.append(clone)
                mounts.append(Mounted(m.slot, clone, m.mount_path, False))
        except BaseException:
            self.drop(made)
            raise
        self._claims[sandbox_id] = tuple(mounts)
        return self._claims[sandbox_id]

    def drop(self, volume_ids: Iterable[str]) -> None:
        for volume_id in volume_ids:
            with contextlib.suppress(VolumeNotFound):
                self.store.delete(volume_id)

    # -- the volume calls of the host port -------------------------------------------------

    def info(self, files: VolumeFiles) -> HostVolume:
        return HostVolume(files.id, files.size_mb, files.created_at, files.source,
                          tuple(sid for sid, _ in self.holders(files.id)))

    async def create(self, volume_id: str, size_mb: int) -> HostVolume:
        return self.info(await asyncio.to_thread(self.store.create, volume_id, size_mb))

    async def get(self, volume_id: str) -> HostVolume:
        return self.info(await asyncio.to_thread(self.store.get, volume_id))

    async def all(self) -> list[HostVolume]:
        return [self.info(f) for f in await asyncio.to_thread(self.store.all)]

    async def resize(self, volume_id: str, size_mb: int) -> HostVolume:
        self._detached(volume_id)
        return self.info(await asyncio.to_thread(self.store.resize, volume_id, size_mb))

    async def delete(self, volume_id: str) -> None:
        self._detached(volume_id)
        await asyncio.to_thread(self.store.delete, volume_id)

    def _detached(self, volume_id: str) -> None:
        self.store.get(volume_id)  # VolumeNotFound first
        held = self.holders(volume_id)
        if held:
            raise VolumeInUse(f"volume {volume_id} is mounted by {held[0][0]}")
