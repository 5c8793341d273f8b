"""The one owner of a runtime's sandboxes: each one's handle (its VM and agent connection, in
memory) and its record (`sandbox.json`, what survives a restart of the host process).

Every part of the runtime (create and kill in `core`, snapshots and forks, hibernation,
migration, transfers, recovery after a restart) reads and changes sandboxes through this
table's methods, so that the two maps stay in step and a record is never kept in memory
without being written to its directory first (ADR 0043)."""

from __future__ import annotations

from pathlib import Path

from pandastack.host.runtime.records import SandboxRecord
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import VMProcess
from pandastack.hostport.errors import SandboxNotFound, SandboxStateError

RECORD_FILE = "sandbox.json"


class SandboxTable:
    """The sandboxes of one runtime by id. A sandbox is *here* once it has a handle; a
    record may come first (a create or an incoming migration writes it before its guest
    answers) and goes with `forget` if the handle never comes."""

    def __init__(self, sandboxes_dir: Path) -> None:
        self.sandboxes_dir = sandboxes_dir
        self._handles: dict[str, SandboxHandle] = {}
        self._records: dict[str, SandboxRecord] = {}

    # -- handles --------------------------------------------------------------------------

    def __contains__(self, sandbox_id: object) -> bool:
        return sandbox_id in self._handles

    def get(self, sandbox_id: str) -> SandboxHandle:
        try:
            return self._handles[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    def find(self, sandbox_id: str) -> SandboxHandle | None:
        return self._handles.get(sandbox_id)

    def handles(self) -> list[SandboxHandle]:
        return list(self._handles.values())

    def ids(self) -> list[str]:
        return list(self._handles)

    def running(self, sandbox_id: str, *allowed: str) -> tuple[SandboxHandle, VMProcess]:
        """The sandbox's handle and VM, if its state is one of `allowed` and it has a VM;
        SandboxNotFound, or SandboxStateError naming its state."""
        handle = self.get(sandbox_id)
        if handle.state not in allowed or handle.vm is None:
            raise SandboxStateError(f"sandbox {sandbox_id} is {handle.state}")
        return handle, handle.vm

    def add(self, handle: SandboxHandle, record: SandboxRecord | None = None) -> None:
        """The sandbox is here (its record, if given, already written to its directory)."""
        self._handles[handle.id] = handle
        if record is not None:
            self._records[record.id] = record

    def take(self, sandbox_id: str) -> SandboxHandle | None:
        """Its handle, no longer here (its record stays until `forget`): a kill that fails
        half-way gives it back with `add`."""
        return self._handles.pop(sandbox_id, None)

    # -- records --------------------------------------------------------------------------

    def record(self, sandbox_id: str) -> SandboxRecord:
        try:
            return self._records[sandbox_id]
        except KeyError:
            raise SandboxNotFound(sandbox_id) from None

    def find_record(self, sandbox_id: str) -> SandboxRecord | None:
        return self._records.get(sandbox_id)

    def records(self) -> list[SandboxRecord]:
        return list(self._records.values())

    def save(self, record: SandboxRecord) -> SandboxRecord:
        """Write the record into its sandbox's directory, then keep it: what is in memory
        is never newer than what a restart would find."""
        record.save(self.sandboxes_dir / record.id / RECORD_FILE)
        self._records[record.id] = record
        return record

    def forget(self, sandbox_id: str) -> SandboxRecord | None:
        """Drop the sandbox's record (its handle, if any, too); the files stay as they are."""
        self._handles.pop(sandbox_id, None)
        return self._records.pop(sandbox_id, None)

    def clear(self) -> None:
        self._handles.clear()
        self._records.clear()
