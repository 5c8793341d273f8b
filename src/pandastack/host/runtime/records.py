"""What a runtime keeps on disk about its sandboxes (`sandbox.json` in each one's directory),
and how `HostRuntime.start()` sorts a state dir it finds: sandboxes to re-adopt, remains of
dead ones."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pandastack.host.vmm.driver import VMPaths, VMProcess

SANDBOX_ID_RE = re.compile(r"^sbx-[0-9a-f]{12}$")
HIBERNATION = "hibernate.stream"
# The record's state while a hibernation is under way: a runtime that finds it at start knows
# the VM was being saved, and keeps the hibernation file if the save completed.
HIBERNATING = "hibernating"
# A sandbox whose VM died (crash, OOM kill, host reboot) with its directory kept: its disk
# (and hibernation, if it has one) stays until the control plane wakes or kills it.
STOPPED = "stopped"


@dataclass(frozen=True)
class SandboxRecord:
    """What is persisted about a sandbox, enough to re-adopt or wake it after a restart."""

    id: str
    template: str
    template_key: str
    template_path: str
    vcpus: int
    memory_mb: int
    disk_bytes: int
    hostname: str
    machine_id: str
    created_at: float
    layers: tuple[str, ...] = ()
    snapshot: str | None = None
    state: str = "running"
    pid: int | None = None
    slot: int | None = None
    network: dict[str, Any] = field(default_factory=dict)
    # Its hibernation is in the object store (a manifest to delete with it, ADR 0020).
    in_store: bool = False
    # The writer token of that manifest when this host wrote or took it over: a kill here
    # deletes the manifest only while it still carries it (another host that woke the
    # sandbox since, and hibernated it again, owns it now).
    store_writer: str = ""
    # The volumes it has mounted (host/volumes/attach.py `Mounted` as dicts).
    volumes: tuple[dict[str, Any], ...] = ()
    # The sandbox it was forked from (SandboxPort.forked_from).
    forked_from: str | None = None

    @property
    def top(self) -> str:
        return self.layers[-1]

    @classmethod
    def load(cls, path: Path) -> SandboxRecord:
        data = json.loads(path.read_text())
        data["layers"] = tuple(data.get("layers", ()))
        data["volumes"] = tuple(data.get("volumes", ()))
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)


@dataclass(frozen=True)
class AdoptReport:
    adopted: list[str]
    cleaned: list[str]
    # Adopted without a VM (among `adopted`): their VMs died while no runtime watched.
    stopped: list[str] = field(default_factory=list)


def try_load(path: Path) -> SandboxRecord | None:
    try:
        record = SandboxRecord.load(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.layers else None


def scan_vmm_processes(sandboxes_dir: Path, cmdlines: Iterable[tuple[int, list[str]]],
                       vm_workdir: Callable[[Sequence[str]], Path | None]) -> dict[str, int]:
    """Map sandbox id -> pid for every live VMM process that belongs to this state dir;
    `vm_workdir` (the driver's `VMMProcesses.vm_workdir`) tells a VM's directory from its
    command line."""
    found: dict[str, int] = {}
    for pid, argv in cmdlines:
        workdir = vm_workdir(argv)
        if (workdir is not None and workdir.parent == sandboxes_dir
                and SANDBOX_ID_RE.match(workdir.name)):
            found[workdir.name] = pid
    return found


def sort_state_dir(sandboxes_dir: Path, running: dict[str, int], known: Container[str],
                   owns: Callable[[int, VMPaths], bool],
                   ) -> tuple[list[tuple[SandboxRecord, VMProcess | None]], list[Path]]:
    """The sandbox directories not `known` yet: those to re-adopt (with their VM, or None for
    a hibernated or stopped one) and the remains to remove. A directory with a good record
    whose VMM is gone is never removed here: its sandbox is adopted `stopped` (or
    `hibernated`, when a hibernation was written whole before the VM ended) and the control
    plane decides (it may be persistent). A VMM process found here that is not the record's
    VM, or one that was being hibernated, is killed. `running` (sandbox id -> VMM pid)
    loses the entries that are looked at."""
    adopt: list[tuple[SandboxRecord, VMProcess | None]] = []
    dead: list[Path] = []
    for entry in sorted(sandboxes_dir.iterdir()):
        if not entry.is_dir() or entry.name in known:
            continue
        paths = VMPaths(entry)
        pid = running.pop(entry.name, None)
        record = try_load(entry / "sandbox.json")
        # asked before any kill below: a killed VMM no longer "owns" anything
        owned = pid is not None and owns(pid, paths)
        if record is not None and owned and record.state != HIBERNATING:
            assert pid is not None
            adopt.append((record, VMProcess(pid, paths)))
            continue
        if pid is not None:
            VMProcess(pid, paths).kill()
            if record is None or not owned:
                dead.append(entry)
                continue
        if record is None:
            dead.append(entry)
            continue
        adopt.append((without_vm(record, entry), None))
    return adopt, dead


def without_vm(record: SandboxRecord, workdir: Path) -> SandboxRecord:
    """The record of a sandbox whose VM is gone: hibernated if its hibernation file is the
    state it was last saved in (a file is only ever there whole: the driver writes a
    `.partial` and renames it), else stopped, with a stale file removed (one left by a
    wake whose VM ran since: the disk has moved on from it)."""
    stream = workdir / HIBERNATION
    stream.with_suffix(".partial").unlink(missing_ok=True)  # a save that did not complete
    if record.state in ("hibernated", HIBERNATING) and stream.exists():
        return replace(record, state="hibernated", pid=None)
    stream.unlink(missing_ok=True)
    return replace(record, state=STOPPED, pid=None)
