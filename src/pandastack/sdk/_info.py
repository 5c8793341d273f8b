"""The fields of a sandbox handle's `info` as read-only properties of the handle itself.

Scripts written against the earlier list read `sbx.state` off the items of `Sandbox.list()`;
the handles that replaced those items keep that working. Each property is the value as last
seen (at create, connect or list, or the last `refresh()`, state change or fork), never a
request. `snapshot` stays `info.snapshot` only: on the handle that name is the method that
takes a snapshot.
"""

from __future__ import annotations

from pandastack.wire.sandboxes import AttachedVolume, RestoredFrom, SandboxInfo, SandboxState


class InfoFields:
    """Read-only views of `self._info`, shared by both twins (sdk/_base.SandboxBase)."""

    _info: SandboxInfo

    @property
    def state(self) -> SandboxState:
        """The state as last seen (`refresh()` asks again; `is_running()` too)."""
        return self._info.state

    @property
    def template(self) -> str:
        """The template it was created from."""
        return self._info.template

    @property
    def name(self) -> str | None:
        """The team's name for it, if it was given one."""
        return self._info.name

    @property
    def metadata(self) -> dict[str, str]:
        """Its labels (a copy: changing it changes nothing on the server)."""
        return dict(self._info.metadata)

    @property
    def host_id(self) -> str | None:
        """The host it runs on, where the server drives many."""
        return self._info.host_id

    @property
    def created_at(self) -> float:
        """When it was created (Unix seconds)."""
        return self._info.created_at

    @property
    def expires_at(self) -> float | None:
        """When its TTL ends it (Unix seconds), if it has one."""
        return self._info.expires_at

    @property
    def ttl_seconds(self) -> int:
        """Its time to live, counted from `created_at`."""
        return self._info.ttl_seconds

    @property
    def persistent(self) -> bool:
        """Whether the idle reaper leaves it alone."""
        return self._info.persistent

    @property
    def vcpus(self) -> int:
        """Its virtual CPUs."""
        return self._info.vcpus

    @property
    def memory_mb(self) -> int:
        """Its memory in MiB."""
        return self._info.memory_mb

    @property
    def disk_mb(self) -> int | None:
        """Its root disk in MiB, if one was asked for."""
        return self._info.disk_mb

    @property
    def volumes(self) -> list[AttachedVolume]:
        """The volumes it has mounted (a copy of the list)."""
        return list(self._info.volumes)

    @property
    def ended_at(self) -> float | None:
        """When it ended (Unix seconds); None while it has not."""
        return self._info.ended_at

    @property
    def end_reason(self) -> str | None:
        """Why it ended (killed, expired, reaped, failed, ...); None while it has not."""
        return self._info.end_reason

    @property
    def stop_reason(self) -> str | None:
        """State stopped: why its VM ended."""
        return self._info.stop_reason

    @property
    def restored_from(self) -> RestoredFrom | None:
        """After a stopped sandbox was started again: what it came back from."""
        return self._info.restored_from
