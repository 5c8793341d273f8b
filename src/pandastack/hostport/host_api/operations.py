"""The host API's request/response operations as data: one row per port method, from which
the agent's routes (`pandastack.host.api.generated`) and the client's calls
(`pandastack.server.hostclient.generated`) are both built. A new port method of that shape is
one row here; nothing else is written by hand for it.

A row says where the method's arguments go (path: the `{names}` of `path`; body: the fields
of `body`, named as the arguments unless `renamed`, or the whole body with `whole_body`;
query: the rest), what answers (`result`, or nothing: 204), and how long the client waits
(`wait`: a field of `hostclient.Timeouts`, or None for no read deadline). Argument and
result types come from the port's own signatures (`hints`).

Streamed operations (frames both ways, a raw request body, a WebSocket) are written out by
hand on both sides and listed in HAND_WRITTEN; tests/server/hostclient/test_operations.py fails when
a port method is in neither.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pandastack.guestproto.ops import (
    METRICS_MAX_WINDOW_MS,
    METRICS_MIN_WINDOW_MS,
    GlobResult,
    GrepResult,
)

from ..protocols import MigrationPort, RuntimePort, SandboxPort, SnapshotTransferPort
from ..results import (
    FileInfo,
    GuestMetrics,
    ImageInfo,
    SnapshotInfo,
    SnapshotResult,
)
from ..volumes import HostVolume, VolumeBackup, VolumePort
from . import models as m
from .codec import HostApiModel

Wait = Literal["lookup", "guest", "lifecycle"] | None
PortClass = type[SandboxPort] | type[RuntimePort] | type[MigrationPort] | \
    type[SnapshotTransferPort] | type[VolumePort]
BINARY = bytes
"""A `result` of raw bytes: an application/octet-stream body, not JSON."""
CONSOLE_DEFAULT_BYTES = 1 << 16
"""What of a guest's console a request that names no `max_bytes` gets (its tail)."""
CONSOLE_MAX_BYTES = 16 << 20
"""The most of a guest's console one request may ask for."""


@dataclass(frozen=True)
class Operation:
    name: str
    port: Any  # one of the port protocols (typed Any: mypy has no type of a Protocol class)
    http: str
    path: str
    operation_id: str
    tag: str
    wait: Wait
    body: type[HostApiModel] | None = None
    whole_body: bool = False
    renamed: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    result: Any = None
    unwrap: str | None = None
    status: int = 200

    # What follows is read on every call on both sides: worked out once per row.

    @functools.cached_property
    def path_names(self) -> tuple[str, ...]:
        return tuple(re.findall(r"{(\w+)}", self.path))

    @property
    def on_sandbox(self) -> bool:
        """A method of one sandbox (`SandboxPort`): the path's `sandbox_id` finds it."""
        return self.port is SandboxPort

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The port method's signature, `self` dropped."""
        method = getattr(self.port, self.name)
        params = list(inspect.signature(method).parameters.values())[1:]
        return inspect.Signature(params)

    def hints(self) -> dict[str, Any]:
        return typing.get_type_hints(getattr(self.port, self.name))

    @functools.cached_property
    def arguments(self) -> tuple[str, ...]:
        return tuple(self.signature.parameters)

    @functools.cached_property
    def body_arguments(self) -> tuple[str, ...]:
        if self.body is None:
            return ()
        if self.whole_body:
            return tuple(a for a in self.arguments if a not in self.path_names)
        wire = set(self.body.model_fields)
        return tuple(a for a in self.arguments if self.renamed.get(a, a) in wire)

    @functools.cached_property
    def query_arguments(self) -> tuple[str, ...]:
        taken = set(self.path_names) | set(self.body_arguments)
        return tuple(a for a in self.arguments if a not in taken)


SANDBOX = "/sandboxes/{sandbox_id}"
_S, _R = SandboxPort, RuntimePort
_M, _T, _V = MigrationPort, SnapshotTransferPort, VolumePort


def _migration(name: str, step: str, operation_id: str, *, takes: bool,
               gives: bool) -> Operation:
    return Operation(name, _M, "POST", f"{SANDBOX}/migration/{step}", operation_id,
                     "migration", "lifecycle",
                     body=m.MigrationDocumentModel if takes else None,
                     renamed={"offer": "document", "ticket": "document",
                              "handoff": "document"},
                     result=m.MigrationDocumentModel if gives else None,
                     unwrap="document" if gives else None, status=200 if gives else 204)


OPERATIONS: tuple[Operation, ...] = (
    # -- the sandboxes' lifecycle on the host -----------------------------------------------
    Operation("create", _R, "POST", "/sandboxes", "createSandbox", "sandboxes", "lifecycle",
              body=m.CreateRequest, result=m.SandboxInfo, status=201),
    Operation("get", _R, "GET", SANDBOX, "getSandbox", "sandboxes", "lookup",
              result=m.SandboxInfo),
    Operation("list_sandboxes", _R, "GET", "/sandboxes", "listSandboxes", "sandboxes",
              "lookup", result=m.SandboxList, unwrap="sandboxes"),
    Operation("kill", _R, "DELETE", SANDBOX, "killSandbox", "sandboxes", "lifecycle",
              status=204),
    *(Operation(action, _R, "POST", f"{SANDBOX}/{action}", f"{action}Sandbox", "sandboxes",
                "lifecycle", status=204)
      for action in ("pause", "resume", "hibernate", "wake")),
    Operation("snapshot", _R, "POST", f"{SANDBOX}/snapshot", "snapshotSandbox", "sandboxes",
              "lifecycle", body=m.SnapshotRequest, result=SnapshotResult, status=201),
    Operation("fork", _R, "POST", f"{SANDBOX}/fork", "forkSandbox", "sandboxes", "lifecycle",
              body=m.ForkRequest, result=m.SandboxList, unwrap="sandboxes", status=201),
    Operation("update_network", _R, "PUT", f"{SANDBOX}/network", "updateNetwork", "sandboxes",
              "lifecycle", body=m.Network, whole_body=True, result=m.Network),
    Operation("placement", _R, "GET", f"{SANDBOX}/placement", "getPlacement", "sandboxes",
              "lookup", result=m.Placement),
    Operation("console_log", _R, "GET", f"{SANDBOX}/console", "getConsoleLog", "sandboxes",
              "lookup", query={"max_bytes": {"default": CONSOLE_DEFAULT_BYTES, "ge": 0,
                                             "le": CONSOLE_MAX_BYTES}},
              result=BINARY),
    Operation("prepare_template", _R, "POST", "/templates/{name}/prepare", "prepareTemplate",
              "templates", None, body=m.PrepareTemplateRequest, status=204),
    Operation("prune_build_cache", _R, "POST", "/templates/build-cache/prune",
              "pruneBuildCache", "templates", "lifecycle", body=m.PruneRequest,
              result=m.Pruned, unwrap="deleted"),
    # The registry's answer is bounded by the host (image_base.INSPECT_DEADLINE_S, 20 s).
    Operation("inspect_image", _R, "POST", "/images/inspect", "inspectImage", "templates",
              "guest", body=m.InspectImageRequest, result=ImageInfo),
    # -- snapshots ----------------------------------------------------------------------------
    Operation("list_snapshots", _R, "GET", "/snapshots", "listSnapshots", "snapshots",
              "lookup", result=m.SnapshotList, unwrap="snapshots"),
    Operation("snapshot_info", _R, "GET", "/snapshots/{snapshot_id}", "getSnapshot",
              "snapshots", "lookup", result=SnapshotInfo),
    Operation("delete_snapshot", _R, "DELETE", "/snapshots/{snapshot_id}", "deleteSnapshot",
              "snapshots", "lifecycle", status=204),
    # -- live migration (ADR 0023) and snapshot transfer (ADR 0024) ----------------------------
    _migration("offer_migration", "offer", "offerMigration", takes=False, gives=True),
    _migration("accept_migration", "accept", "acceptMigration", takes=True, gives=True),
    _migration("migrate", "send", "migrateSandbox", takes=True, gives=True),
    _migration("complete_migration", "complete", "completeMigration", takes=True, gives=False),
    _migration("release_migrated", "release", "releaseMigrated", takes=False, gives=False),
    _migration("abort_migration", "abort", "abortMigration", takes=False, gives=False),
    Operation("offer_snapshot", _T, "POST", f"{SANDBOX}/snapshot-transfer/offer",
              "offerSnapshotTransfer", "snapshot transfer", "lifecycle",
              result=m.TransferDocumentModel, unwrap="document"),
    Operation("accept_snapshot", _T, "POST", "/snapshot-transfers/accept",
              "acceptSnapshotTransfer", "snapshot transfer", "lifecycle",
              body=m.TransferDocumentModel, renamed={"offer": "document"},
              result=m.TransferDocumentModel, unwrap="document"),
    Operation("send_snapshot", _T, "POST", "/snapshots/{snapshot_id}/transfer",
              "sendSnapshotTransfer", "snapshot transfer", "lifecycle",
              body=m.TransferDocumentModel, renamed={"ticket": "document"}, status=204),
    # -- volumes (ADR 0027) -------------------------------------------------------------------
    Operation("create_volume", _V, "POST", "/volumes", "createVolume", "volumes", "lifecycle",
              body=m.CreateVolumeRequest, result=HostVolume, status=201),
    Operation("list_volumes", _V, "GET", "/volumes", "listVolumes", "volumes", "lookup",
              result=m.HostVolumeList, unwrap="volumes"),
    Operation("get_volume", _V, "GET", "/volumes/{volume_id}", "getVolume", "volumes",
              "lookup", result=HostVolume),
    Operation("resize_volume", _V, "POST", "/volumes/{volume_id}/resize", "resizeVolume",
              "volumes", "lifecycle", body=m.ResizeVolumeRequest, result=HostVolume),
    Operation("delete_volume", _V, "DELETE", "/volumes/{volume_id}", "deleteVolume",
              "volumes", "lifecycle", status=204),
    # A backup and a restore move a whole image to or from the object store: no deadline.
    Operation("backup_volume", _V, "POST", "/volumes/{volume_id}/backup", "backupVolume",
              "volumes", None, body=m.BackupVolumeRequest, result=VolumeBackup, status=201),
    Operation("restore_volume", _V, "POST", "/volume-backups/restore", "restoreVolumeBackup",
              "volumes", None, body=m.RestoreVolumeRequest, result=HostVolume, status=201),
    Operation("delete_volume_backup", _V, "DELETE", "/volume-backups/{backup_id}",
              "deleteVolumeBackup", "volumes", "lifecycle", status=204),
    # -- one sandbox's processes --------------------------------------------------------------
    Operation("spawn", _S, "POST", f"{SANDBOX}/processes", "spawnProcess", "processes",
              "guest", body=m.SpawnRequest, result=m.Spawned, unwrap="pid", status=201),
    Operation("procs", _S, "GET", f"{SANDBOX}/processes", "listProcesses", "processes",
              "guest", result=m.ProcessList, unwrap="processes"),
    Operation("signal", _S, "POST", f"{SANDBOX}/processes/{{pid}}/signal", "signalProcess",
              "processes", "guest", body=m.SignalRequest, renamed={"sig": "signal"},
              status=204),
    Operation("send_stdin", _S, "POST", f"{SANDBOX}/processes/{{pid}}/stdin", "sendStdin",
              "processes", "guest", body=m.StdinRequest, status=204),
    Operation("pty_create", _S, "POST", f"{SANDBOX}/pty", "createPty", "processes", "guest",
              body=m.PtyRequest, result=m.Spawned, unwrap="pid", status=201),
    # -- one sandbox's files ------------------------------------------------------------------
    Operation("list_dir", _S, "GET", f"{SANDBOX}/files", "listDir", "files", "guest",
              query={"path": {"description": "an absolute path in the guest"}},
              result=m.DirList, unwrap="entries"),
    Operation("stat", _S, "GET", f"{SANDBOX}/files/stat", "statFile", "files", "guest",
              query={"path": {"description": "an absolute path in the guest"}},
              result=FileInfo),
    Operation("mkdir", _S, "POST", f"{SANDBOX}/files/mkdir", "makeDir", "files", "guest",
              body=m.MkdirRequest, status=204),
    Operation("remove", _S, "DELETE", f"{SANDBOX}/files", "removeFile", "files", "guest",
              query={"path": {"description": "an absolute path in the guest"}}, status=204),
    Operation("rename", _S, "POST", f"{SANDBOX}/files/rename", "renameFile", "files", "guest",
              body=m.RenameRequest, status=204),
    Operation("grep", _S, "GET", f"{SANDBOX}/files/grep", "grepFiles", "files", "guest",
              query={"path": {"description": "an absolute path in the guest"}},
              result=GrepResult),
    Operation("glob", _S, "GET", f"{SANDBOX}/files/glob", "globFiles", "files", "guest",
              query={"path": {"description": "an absolute path in the guest"}},
              result=GlobResult),
    # -- one sandbox's code interpreter (a context may take the guest's 600 s to start) ------
    Operation("create_code_context", _S, "POST", f"{SANDBOX}/code/contexts",
              "createCodeContext", "code", "lifecycle", body=m.CodeContextRequest,
              result=m.CodeContext, unwrap="context", status=201),
    Operation("list_code_contexts", _S, "GET", f"{SANDBOX}/code/contexts", "listCodeContexts",
              "code", "lifecycle", result=m.CodeContextList, unwrap="contexts"),
    Operation("delete_code_context", _S, "DELETE", f"{SANDBOX}/code/contexts/{{context_id}}",
              "deleteCodeContext", "code", "lifecycle", status=204),
    Operation("restart_code_context", _S, "POST",
              f"{SANDBOX}/code/contexts/{{context_id}}/restart", "restartCodeContext", "code",
              "lifecycle", status=204),
    # -- one sandbox's metrics ----------------------------------------------------------------
    Operation("metrics", _S, "GET", f"{SANDBOX}/metrics", "getSandboxMetrics", "sandboxes",
              "guest", query={"window_ms": {"ge": METRICS_MIN_WINDOW_MS,
                                            "le": METRICS_MAX_WINDOW_MS}},
              result=GuestMetrics),
)

HAND_WRITTEN: Mapping[str, str] = {
    # name -> the operationId of its hand-written route (or "" for no route), and why
    "exec": "execCommand",            # output streamed in frames, then the exit
    "attach": "attachProcess",        # a backlog, live output and the exit, in frames
    "spawn_attach": "spawnAttachProcess",  # the pid, then output and the exit, in frames
    "read_file": "readFile",          # DATA frames (a failure midway is told, not an EOF)
    "write_file": "writeFile",        # the raw request body, streamed to the guest
    "watch": "watchFiles",            # EVENT frames until closed
    "run_code": "runCode",            # EVENT frames, "end" last
    "build_template": "buildTemplate",  # LOG frames, then the result
    "pty_connect": "connectPty",      # a WebSocket
    "start": "",                      # the client's own: checks the agent answers
    "close": "",                      # the client's own: closes its connections
    "handle": "",                     # made without a round trip (RuntimePort.handle)
    "is_alive": "",                   # what the lookup said (SandboxInfo.alive)
    "forked_from": "",                # what the lookup said (SandboxInfo.forked_from)
}
"""Port methods that are no row of OPERATIONS, with the operationId of their route."""

BY_NAME: Mapping[str, Operation] = {op.name: op for op in OPERATIONS}
