"""`mount_volume` / `unmount_volume` of `AgentClient` (spec/guest-protocol.md)."""

from __future__ import annotations

from pandastack.host.agentlink.channel import AgentChannel


class VolumeOps(AgentChannel):
    async def mount_volume(self, serial: str, path: str, size_bytes: int, *,
                           read_only: bool = False) -> str:
        """Mount the disk whose virtio serial is `serial` at `path`; the guest's device."""
        f = await self._call("mount_volume", serial=serial, path=path, size_bytes=size_bytes,
                             read_only=read_only)
        return str(f.header.get("device", ""))

    async def freeze_volume(self, path: str) -> None:
        """Flush and freeze the file system at `path`: clean on disk until the VM ends."""
        await self._call("freeze_volume", path=path)

    async def unmount_volume(self, path: str) -> None:
        await self._call("unmount_volume", path=path)
