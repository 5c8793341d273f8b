"""What the host API carries (spec/host-openapi.json): the pydantic models of its requests and
results, shared by the agent's routes (`pandastack.host.api`) and their client
(`pandastack.server.hostclient`), the conversions between them and the port's values
(`hostport.results`, `hostport.network`), and the error envelope.

Errors travel by class name: `{"error": {"type": "GuestOSError", "message": str(exc),
"attributes": {"errno_name": "ENOENT", ...}}}`. The attributes are the exception's own public
scalar attributes (GuestOSError's errno_name/message/path, SnapshotFailed's disk_switched and
no_space, BuildFailed's step/instruction/exit_code/output), nested so that none can collide
with the envelope's `message`. The client rebuilds the same class from `hostport.errors` with
the same `str()` and attributes; a name it does not know becomes a plain HostError.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, PlainSerializer, PlainValidator, WithJsonSchema

from pandastack.templatespec import TemplateSpec
from pandastack.wire.base import Strict

from . import errors as errors_module
from .errors import HostError
from .network import NetworkPolicy
from .protocols import SandboxPlacement, SandboxPort
from .pty import DEFAULT_COLS, DEFAULT_ROWS, MAX_DIM
from .results import (
    BuildResult,
    CodeEvent,
    ExecResult,
    FileInfo,
    GuestMetrics,
    SnapshotInfo,
    SnapshotResult,
)
from .volumes import HostVolume, VolumeBackup, VolumeMountRequest

ErrorValue = str | int | float | bool | None
M = TypeVar("M", bound=BaseModel)


def dump_json(value: BaseModel | Any) -> bytes:
    """The host API's JSON of a model (or of plain JSON data), ASCII only. Strings from the
    guest (file names, command lines, messages) carry each byte that is not UTF-8 as a lone
    surrogate (surrogateescape); UTF-8 cannot hold those but a `\\u` escape can, so they
    cross unchanged and the control plane sees what it would see in-process."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode()


def load_json(model: type[M], payload: bytes | str) -> M:
    """The model `dump_json` wrote (pydantic's own JSON parser refuses lone surrogates)."""
    return model.model_validate(json.loads(payload))


def _bytes_or_base64(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return base64.b64decode(value, validate=True)
    raise ValueError("expected base64 text")


# Bytes in JSON: base64 there, the bytes themselves in Python (pydantic's Base64Bytes would
# also decode bytes given in Python, as if they were base64).
Base64 = Annotated[
    bytes, PlainValidator(_bytes_or_base64),
    PlainSerializer(lambda b: base64.b64encode(b).decode(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]

# -- errors ---------------------------------------------------------------------------------


class ErrorBody(Strict):
    type: str = Field(description="the error's class in pandastack.hostport.errors, or "
                                  "ValueError (a request the host refused as invalid)")
    message: str
    attributes: dict[str, ErrorValue] = Field(default_factory=dict)


class ErrorEnvelope(Strict):
    error: ErrorBody


def error_classes() -> dict[str, type[Exception]]:
    """Every error class the wire names: those of `hostport.errors`, and ValueError."""
    found: dict[str, type[Exception]] = {"ValueError": ValueError}
    for name, value in vars(errors_module).items():
        if isinstance(value, type) and issubclass(value, HostError):
            found[name] = value
    return found


_CLASSES = error_classes()
_BY_CLASS = {cls: name for name, cls in _CLASSES.items()}

# The HTTP status of each error (nearest class in the MRO wins). The client re-raises by
# type, not by status; statuses are for people reading logs and for generic HTTP tools.
_STATUS: dict[type[Exception], int] = {
    ValueError: 400,
    errors_module.UnsupportedLanguage: 400,
    errors_module.SandboxNotFound: 404,
    errors_module.SnapshotNotFound: 404,
    errors_module.TemplateNotFound: 404,
    errors_module.CodeContextNotFound: 404,
    errors_module.SandboxStateError: 409,
    errors_module.VolumeNotFound: 404,
    errors_module.VolumeInUse: 409,
    errors_module.CodeInterpreterUnavailable: 409,
    errors_module.CodeInterpreterError: 422,
    errors_module.GuestOSError: 422,
    errors_module.BuildFailed: 422,
    errors_module.VMExited: 409,
    errors_module.AgentError: 502,
    errors_module.HugePagesUnavailable: 503,
    errors_module.HostUnavailable: 503,
    errors_module.HostExhausted: 503,
    errors_module.ObjectStoreUnavailable: 503,
    errors_module.ObjectNotFound: 404,
    errors_module.NoObjectStore: 409,
    HostError: 500,
}


def _wire_class(exc: BaseException) -> type[Exception] | None:
    for cls in type(exc).__mro__:
        if cls in _BY_CLASS:
            return cls
    return None


def status_of(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def encode_error(exc: BaseException) -> ErrorEnvelope:
    """The envelope of `exc`. An exception that is neither a HostError nor a ValueError is a
    bug in the host: it goes as a HostError naming its class."""
    cls = _wire_class(exc)
    if cls is None:
        return ErrorEnvelope(error=ErrorBody(
            type="HostError", message=f"internal error in the host agent: "
                                      f"{type(exc).__name__}: {exc}"))
    attributes = {key: value for key, value in vars(exc).items()
                  if not key.startswith("_")
                  and (value is None or isinstance(value, str | int | float | bool))}
    return ErrorEnvelope(error=ErrorBody(type=_BY_CLASS[cls], message=str(exc),
                                         attributes=attributes))


def decode_error(body: ErrorBody) -> Exception:
    """The exception `body` names, with its message and attributes (not raised)."""
    cls = _CLASSES.get(body.type, HostError)
    if cls is ValueError:
        return ValueError(body.message)
    # Not through __init__: the message is already formatted (GuestOSError, SnapshotFailed
    # prefix theirs), and the attributes are set as they were.
    exc = cls.__new__(cls, body.message)
    exc.args = (body.message,)
    for key, value in body.attributes.items():
        setattr(exc, key, value)
    return exc


# -- sandboxes and their host-side state ----------------------------------------------------


class SandboxInfo(Strict):
    id: str
    state: str = Field(description='"running", "paused", "hibernated" or "stopped" (its VM '
                                   'died, its disk kept; a wake boots it)')
    alive: bool = Field(description="the VM process runs (false when hibernated or dead)")

    @classmethod
    def of(cls, sandbox: SandboxPort) -> SandboxInfo:
        return cls(id=sandbox.id, state=sandbox.state, alive=sandbox.is_alive())


class SandboxList(Strict):
    sandboxes: list[SandboxInfo]


class Network(Strict):
    internet: bool = True
    allow_out: list[str] = Field(default_factory=list)
    deny_out: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, policy: NetworkPolicy) -> Network:
        return cls(internet=policy.internet, allow_out=list(policy.allow_out),
                   deny_out=list(policy.deny_out))

    def policy(self) -> NetworkPolicy:
        return NetworkPolicy.from_dict(self.model_dump())


def network_of(model: Network | None) -> NetworkPolicy | None:
    return None if model is None else model.policy()


def network_model(policy: NetworkPolicy | None) -> Network | None:
    return None if policy is None else Network.of(policy)


class VolumeMountModel(Strict):
    volume_id: str = Field(max_length=64)
    mount_path: str = Field(max_length=1024)
    read_only: bool = False

    @classmethod
    def of(cls, request: VolumeMountRequest) -> VolumeMountModel:
        return cls(volume_id=request.volume_id, mount_path=request.mount_path,
                   read_only=request.read_only)

    def value(self) -> VolumeMountRequest:
        return VolumeMountRequest(self.volume_id, self.mount_path, self.read_only)


class HostVolumeModel(Strict):
    id: str
    size_mb: int
    created_at: float
    source: str | None = None
    attached_to: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, volume: HostVolume) -> HostVolumeModel:
        return cls(id=volume.id, size_mb=volume.size_mb, created_at=volume.created_at,
                   source=volume.source, attached_to=list(volume.attached_to))

    def value(self) -> HostVolume:
        return HostVolume(self.id, self.size_mb, self.created_at, self.source,
                          tuple(self.attached_to))


class HostVolumeList(Strict):
    volumes: list[HostVolumeModel]


class CreateVolumeRequest(Strict):
    volume_id: str = Field(max_length=64)
    size_mb: int


class ResizeVolumeRequest(Strict):
    size_mb: int


class BackupVolumeRequest(Strict):
    backup_id: str = Field(max_length=64)


class RestoreVolumeRequest(Strict):
    backup_id: str = Field(max_length=64)
    volume_id: str = Field(max_length=64)


class VolumeBackupModel(Strict):
    id: str
    volume_id: str
    size_mb: int
    stored_bytes: int
    created_at: float

    @classmethod
    def of(cls, backup: VolumeBackup) -> VolumeBackupModel:
        return cls(id=backup.id, volume_id=backup.volume_id, size_mb=backup.size_mb,
                   stored_bytes=backup.stored_bytes, created_at=backup.created_at)

    def value(self) -> VolumeBackup:
        return VolumeBackup(self.id, self.volume_id, self.size_mb, self.stored_bytes,
                            self.created_at)


class CreateRequest(Strict):
    template: str = "base"
    vcpus: int = 1
    memory_mb: int = 512
    disk_mb: int | None = None
    sandbox_id: str | None = None
    snapshot: str | None = None
    network: Network | None = None
    volumes: list[VolumeMountModel] = Field(default_factory=list, max_length=16)


class PrepareTemplateRequest(Strict):
    vcpus: int = 1
    memory_mb: int = 512


class SnapshotRequest(Strict):
    name: str | None = None
    internal: bool = False


class ForkRequest(Strict):
    count: int = 1


class Placement(Strict):
    network: Network | None
    ns_ip: str | None

    @classmethod
    def of(cls, placement: SandboxPlacement) -> Placement:
        return cls(network=network_model(placement.network), ns_ip=placement.ns_ip)

    def value(self) -> SandboxPlacement:
        return SandboxPlacement(network=network_of(self.network), ns_ip=self.ns_ip)


# -- snapshots ------------------------------------------------------------------------------


class SnapshotInfoModel(Strict):
    id: str
    name: str | None
    source: str
    template: str
    template_path: str
    vcpus: int
    memory_mb: int
    disk_bytes: int
    layers: list[str]
    created_at: float
    state_bytes: int
    internal: bool = False
    size_bytes: int = 0
    transient: bool = False
    volumes: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def of(cls, info: SnapshotInfo) -> SnapshotInfoModel:
        return cls.model_validate({**asdict(info), "layers": list(info.layers),
                                   "volumes": list(info.volumes)})

    def value(self) -> SnapshotInfo:
        return SnapshotInfo(**{**self.model_dump(), "layers": tuple(self.layers),
                               "volumes": tuple(self.volumes)})


class SnapshotList(Strict):
    snapshots: list[SnapshotInfoModel]


class SnapshotResultModel(Strict):
    info: SnapshotInfoModel
    pause_ms: float
    method: str

    @classmethod
    def of(cls, result: SnapshotResult) -> SnapshotResultModel:
        return cls(info=SnapshotInfoModel.of(result.info), pause_ms=result.pause_ms,
                   method=result.method)

    def value(self) -> SnapshotResult:
        return SnapshotResult(info=self.info.value(), pause_ms=self.pause_ms,
                              method=self.method)


# -- processes ------------------------------------------------------------------------------


class ExecRequest(Strict):
    cmd: str | list[str] = Field(description="a string runs through /bin/sh -c; a list is "
                                             "the argv")
    timeout: float | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    stdin: Base64 | None = None
    user: str | None = None
    max_output: int | None = Field(
        default=None, ge=0,
        description="bytes of each of stdout and stderr the caller keeps for its result "
                    "(None: rules.DEFAULT_EXEC_OUTPUT_MB): the RESULT's `truncated` says "
                    "whether more came; every byte is still sent in frames")


class ExecDone(Strict):
    """The final RESULT frame of an exec or an attach: the output came before it, in STDOUT
    and STDERR frames (the client keeps it for the ExecResult)."""

    exit_code: int
    duration_ms: float
    timed_out: bool
    signal: int | None
    truncated: bool

    @classmethod
    def of(cls, result: ExecResult) -> ExecDone:
        return cls(exit_code=result.exit_code, duration_ms=result.duration_ms,
                   timed_out=result.timed_out, signal=result.signal,
                   truncated=result.truncated)

    def value(self, stdout: bytes, stderr: bytes, truncated: bool) -> ExecResult:
        return ExecResult(exit_code=self.exit_code, stdout=stdout, stderr=stderr,
                          duration_ms=self.duration_ms, timed_out=self.timed_out,
                          signal=self.signal, truncated=self.truncated or truncated)


class SpawnRequest(Strict):
    cmd: str | list[str]
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    timeout: float | None = Field(default=None, gt=0, description="seconds, then the "
                                  "process's tree is killed and its exit says timed_out")


class Replay(Strict):
    """The REPLAY frame that opens an attach: bytes of each stream the guest's 1 MiB rings
    had dropped before the backlog that follows."""

    stdout_dropped: int = Field(ge=0)
    stderr_dropped: int = Field(ge=0)


class Spawned(Strict):
    pid: int


class PtyRequest(Strict):
    """A process on a new terminal (hostport.pty): `cmd`, or the user's shell."""

    cols: int = Field(default=DEFAULT_COLS, ge=1, le=MAX_DIM)
    rows: int = Field(default=DEFAULT_ROWS, ge=1, le=MAX_DIM)
    cmd: str | list[str] | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None


class ProcessList(Strict):
    processes: list[dict[str, Any]]


class SignalRequest(Strict):
    signal: int


class StdinRequest(Strict):
    data: Base64 = b""
    eof: bool = False


# -- files ----------------------------------------------------------------------------------


class FileInfoModel(Strict):
    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: float

    @classmethod
    def of(cls, info: FileInfo) -> FileInfoModel:
        return cls.model_validate(asdict(info))

    def value(self) -> FileInfo:
        return FileInfo(**self.model_dump())


class DirList(Strict):
    entries: list[FileInfoModel]


class GuestMetricsModel(Strict):
    cpu_percent: float
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    disk_used_bytes: int
    disk_total_bytes: int
    window_ms: int

    @classmethod
    def of(cls, metrics: GuestMetrics) -> GuestMetricsModel:
        return cls.model_validate(asdict(metrics))

    def value(self) -> GuestMetrics:
        return GuestMetrics(**self.model_dump())


class Written(Strict):
    size: int = Field(description="bytes written")


class ReadDone(Strict):
    """The final RESULT frame of a file read (its bytes came before it, in DATA frames)."""

    size: int


class MkdirRequest(Strict):
    path: str
    parents: bool = True


class RenameRequest(Strict):
    src: str
    dst: str


# -- code interpreter -----------------------------------------------------------------------


class RunCodeRequest(Strict):
    code: str
    language: str = "python"
    context_id: str | None = None
    timeout: float | None = None
    env: dict[str, str] | None = None


class CodeEventModel(Strict):
    type: str
    text: str = ""
    data: dict[str, str] | None = None
    is_main_result: bool = False
    name: str = ""
    value: str = ""
    traceback: str = ""
    execution_count: int | None = None

    @classmethod
    def of(cls, event: CodeEvent) -> CodeEventModel:
        return cls.model_validate(asdict(event))

    def event(self) -> CodeEvent:
        return CodeEvent(**self.model_dump())


class RunDone(Strict):
    """The final RESULT frame of a code run (its events, "end" last, came before it)."""

    events: int


class CodeContextRequest(Strict):
    language: str = "python"
    cwd: str | None = None


class CodeContext(Strict):
    context: dict[str, Any]


class CodeContextList(Strict):
    contexts: list[dict[str, Any]]


# -- templates ------------------------------------------------------------------------------


class BuildRequest(Strict):
    spec: TemplateSpec
    network: Network | None = None
    vcpus: int = 1
    memory_mb: int = 512
    cache_scope: str = ""


class BuildResultModel(Strict):
    snapshot_id: str
    env: dict[str, str]
    workdir: str | None
    user: str | None
    start: str | None
    steps_total: int
    steps_cached: int
    seconds: float

    @classmethod
    def of(cls, result: BuildResult) -> BuildResultModel:
        return cls.model_validate(asdict(result))

    def value(self) -> BuildResult:
        return BuildResult(**self.model_dump())


class PruneRequest(Strict):
    keep_newest: int


class Pruned(Strict):
    deleted: list[str]


class HostStatus(Strict):
    status: Literal["ok"] = "ok"
    sandboxes: int


class MigrationDocumentModel(Strict):
    """A live migration's offer, ticket or handoff (hostport.results.MigrationDocument)."""

    document: dict[str, Any]


class TransferDocumentModel(Strict):
    """A snapshot transfer's offer or ticket (hostport.results.TransferDocument)."""

    document: dict[str, Any]
