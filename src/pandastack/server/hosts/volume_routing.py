"""Volume calls of a pool of hosts (ADR 0027): each volume lives on one host. A call goes to
the host the request's context pins (`pinning.pinned_host`: the control plane pins the
volume's host from its table), else to the host last seen holding it, else to whichever host
answers that it has it. A new volume goes to the pinned host or the best-ranked one that
takes it, which is reported in `HostVolume.host_id`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from pandastack.hostport.errors import HostExhausted, HostUnavailable, VolumeNotFound
from pandastack.hostport.protocols import RuntimePort
from pandastack.hostport.volumes import HostVolume, VolumeBackup, VolumePort
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS

from .pinning import pinned_host


def volume_port(host: RuntimePort) -> VolumePort:
    if not isinstance(host, VolumePort):
        raise VolumeNotFound("this host keeps no volumes")
    return host


class VolumeRouting:
    hosts: dict[str, RuntimePort]
    _unreachable: set[str]
    _create_candidates: Callable[[str, int, int, str | None], list[str]]
    # volume id -> the host last seen holding it (set by the pool's __init__)
    _volume_hosts: dict[str, str]

    async def volume_host(self, volume_id: str) -> str:
        pinned = pinned_host.get()
        if pinned is not None and pinned in self.hosts:
            return pinned
        known = self._volume_hosts.get(volume_id)
        if known is not None and known in self.hosts:
            return known
        names = [h for h in self.hosts if h not in self._unreachable]
        found = await asyncio.gather(*(volume_port(self.hosts[h]).get_volume(volume_id)
                                       for h in names), return_exceptions=True)
        for host_id, result in zip(names, found, strict=True):
            if isinstance(result, HostVolume):
                self._volume_hosts[volume_id] = host_id
                return host_id
        if self._unreachable:
            raise HostUnavailable(f"volume {volume_id} may be on a host out of reach "
                                  f"({', '.join(sorted(self._unreachable))})")
        raise VolumeNotFound(volume_id)

    async def _place(self, volume_id: str,
                     make: Callable[[VolumePort], Awaitable[HostVolume]]) -> HostVolume:
        """A new volume on the pinned host, else on the best-ranked one that takes it."""
        pinned = pinned_host.get()
        candidates = [pinned] if pinned is not None else \
            self._create_candidates(DEFAULT_TEMPLATE, DEFAULT_VCPUS, DEFAULT_MEMORY_MB, None)
        refused: list[str] = []
        for host_id in candidates:
            if host_id not in self.hosts:
                raise HostExhausted(f"no host {host_id!r}")
            try:
                made = await make(volume_port(self.hosts[host_id]))
            except (HostExhausted, HostUnavailable) as exc:
                refused.append(f"{host_id}: {exc}")
                continue
            self._volume_hosts[volume_id] = host_id
            return replace(made, host_id=host_id)
        raise HostExhausted("no host took the volume" +
                            (f" ({'; '.join(refused)})" if refused else ""))

    async def create_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        return await self._place(volume_id, lambda port: port.create_volume(volume_id, size_mb))

    async def restore_volume(self, backup_id: str, volume_id: str) -> HostVolume:
        return await self._place(volume_id,
                                 lambda port: port.restore_volume(backup_id, volume_id))

    async def backup_volume(self, volume_id: str, backup_id: str) -> VolumeBackup:
        host_id = await self.volume_host(volume_id)
        return await volume_port(self.hosts[host_id]).backup_volume(volume_id, backup_id)

    async def delete_volume_backup(self, backup_id: str) -> None:
        # The store is the hosts' own: any host that answers can delete from it.
        names = [h for h in self.hosts if h not in self._unreachable]
        if not names:
            raise HostUnavailable("no host is reachable to delete the backup")
        await volume_port(self.hosts[names[0]]).delete_volume_backup(backup_id)

    async def get_volume(self, volume_id: str) -> HostVolume:
        host_id = await self.volume_host(volume_id)
        return replace(await volume_port(self.hosts[host_id]).get_volume(volume_id),
                       host_id=host_id)

    async def list_volumes(self) -> Sequence[HostVolume]:
        names = [h for h in self.hosts if h not in self._unreachable]
        listed = await asyncio.gather(*(volume_port(self.hosts[h]).list_volumes()
                                        for h in names))
        return [replace(v, host_id=h) for h, vols in zip(names, listed, strict=True)
                for v in vols]

    async def resize_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        host_id = await self.volume_host(volume_id)
        return replace(await volume_port(self.hosts[host_id]).resize_volume(volume_id, size_mb),
                       host_id=host_id)

    async def delete_volume(self, volume_id: str) -> None:
        host_id = await self.volume_host(volume_id)
        await volume_port(self.hosts[host_id]).delete_volume(volume_id)
        self._volume_hosts.pop(volume_id, None)
