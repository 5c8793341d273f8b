"""The host API's own bodies: requests, the wrappers of list and scalar answers, and the
RESULT frames of its streams. The port's results (`hostport.results`, `hostport.volumes`,
`hostport.watch`) are not re-modelled here: they cross as the dataclasses they are."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, SecretStr, field_serializer, model_validator

from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS
from pandastack.templatespec import TemplateSpec

from ..network import NetworkPolicy
from ..protocols import SandboxPlacement
from ..pty import DEFAULT_COLS, DEFAULT_ROWS, MAX_DIM
from ..registries import RegistryLogin, RegistryLogins
from ..results import ExecResult, FileInfo, SnapshotInfo
from ..volumes import HostVolume, VolumeMountRequest
from ..watch import WatchEvent
from .codec import Base64, HostApiModel

# -- values with a port form of their own (`port_value()`) ------------------------------------


class Network(HostApiModel):
    internet: bool = True
    allow_out: list[str] = Field(default_factory=list)
    deny_out: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, policy: NetworkPolicy) -> Network:
        return cls(internet=policy.internet, allow_out=list(policy.allow_out),
                   deny_out=list(policy.deny_out))

    def port_value(self) -> NetworkPolicy:
        """The policy, judged as in-process (bad entries: ValueError, a 400)."""
        return NetworkPolicy.from_dict(self.model_dump())


def network_model(policy: NetworkPolicy | None) -> Network | None:
    return None if policy is None else Network.of(policy)


class VolumeMountModel(HostApiModel):
    volume_id: str = Field(max_length=64)
    mount_path: str = Field(max_length=1024)
    read_only: bool = False

    def port_value(self) -> VolumeMountRequest:
        return VolumeMountRequest(self.volume_id, self.mount_path, self.read_only)


class Placement(HostApiModel):
    network: Network | None
    ns_ip: str | None

    def port_value(self) -> SandboxPlacement:
        return SandboxPlacement(
            network=None if self.network is None else self.network.port_value(),
            ns_ip=self.ns_ip)


def port_value(value: Any) -> Any:
    """What the port takes or returns for a value read off the wire (lists and dicts
    element-wise)."""
    if isinstance(value, list):
        return [port_value(v) for v in value]
    if isinstance(value, dict):
        return {k: port_value(v) for k, v in value.items()}
    method = getattr(value, "port_value", None)
    return method() if isinstance(value, HostApiModel) and callable(method) else value


# -- sandboxes ------------------------------------------------------------------------------


class SandboxInfo(HostApiModel):
    id: str
    state: str = Field(description='"running", "paused", "hibernated" or "stopped" (its VM '
                                   'died, its disk kept; a wake boots it)')
    alive: bool = Field(description="the VM process runs (false when hibernated or dead)")
    forked_from: str | None = Field(default=None, description="the sandbox it is a fork child of")

    @model_validator(mode="before")
    @classmethod
    def _of_port(cls, data: Any) -> Any:
        """A `SandboxPort` as the route has it (its liveness is a call, not a field)."""
        if callable(getattr(data, "is_alive", None)):
            return {"id": data.id, "state": data.state, "alive": data.is_alive(),
                    "forked_from": data.forked_from}
        return data


class SandboxList(HostApiModel):
    sandboxes: list[SandboxInfo]


class CreateRequest(HostApiModel):
    template: str = DEFAULT_TEMPLATE
    vcpus: int = DEFAULT_VCPUS
    memory_mb: int = DEFAULT_MEMORY_MB
    disk_mb: int | None = None
    sandbox_id: str | None = None
    snapshot: str | None = None
    network: Network | None = None
    volumes: list[VolumeMountModel] = Field(default_factory=list, max_length=16)


class PrepareTemplateRequest(HostApiModel):
    vcpus: int = DEFAULT_VCPUS
    memory_mb: int = DEFAULT_MEMORY_MB


class SnapshotRequest(HostApiModel):
    name: str | None = None
    internal: bool = False


class ForkRequest(HostApiModel):
    count: int = 1


class SnapshotList(HostApiModel):
    snapshots: list[SnapshotInfo]


class MigrationDocumentModel(HostApiModel):
    """A live migration's offer, ticket or handoff (hostport.results.MigrationDocument)."""

    document: dict[str, Any]


class TransferDocumentModel(HostApiModel):
    """A snapshot transfer's offer or ticket (hostport.results.TransferDocument)."""

    document: dict[str, Any]


class HostStatus(HostApiModel):
    status: Literal["ok"] = "ok"
    sandboxes: int


# -- volumes --------------------------------------------------------------------------------


class HostVolumeList(HostApiModel):
    volumes: list[HostVolume]


class CreateVolumeRequest(HostApiModel):
    volume_id: str = Field(max_length=64)
    size_mb: int


class ResizeVolumeRequest(HostApiModel):
    size_mb: int


class BackupVolumeRequest(HostApiModel):
    backup_id: str = Field(max_length=64)


class RestoreVolumeRequest(HostApiModel):
    backup_id: str = Field(max_length=64)
    volume_id: str = Field(max_length=64)


# -- processes ------------------------------------------------------------------------------


class ExecRequest(HostApiModel):
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


class ExecDone(HostApiModel):
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


class SpawnRequest(HostApiModel):
    cmd: str | list[str]
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None
    timeout: float | None = Field(default=None, gt=0, description="seconds, then the "
                                  "process's tree is killed and its exit says timed_out")


class SpawnAttachRequest(SpawnRequest):
    stdin: bool = Field(default=True, description="false: the process has no stdin")
    keep_output: bool = Field(default=True, description="false: the RESULT's output is not "
                              "kept (a stream of a long-lived process)")


class Replay(HostApiModel):
    """The REPLAY frame that opens an attach: bytes of each stream the guest's 1 MiB rings
    had dropped before the backlog that follows."""

    stdout_dropped: int = Field(ge=0)
    stderr_dropped: int = Field(ge=0)


class Spawned(HostApiModel):
    pid: int


class PtyRequest(HostApiModel):
    """A process on a new terminal (hostport.pty): `cmd`, or the user's shell."""

    cols: int = Field(default=DEFAULT_COLS, ge=1, le=MAX_DIM)
    rows: int = Field(default=DEFAULT_ROWS, ge=1, le=MAX_DIM)
    cmd: str | list[str] | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    user: str | None = None


class ProcessList(HostApiModel):
    processes: list[dict[str, Any]]


class SignalRequest(HostApiModel):
    signal: int


class StdinRequest(HostApiModel):
    data: Base64 = b""
    eof: bool = False


# -- files ----------------------------------------------------------------------------------


class DirList(HostApiModel):
    entries: list[FileInfo]


class Written(HostApiModel):
    size: int = Field(description="bytes written")


class ReadDone(HostApiModel):
    """The final RESULT frame of a file read (its bytes came before it, in DATA frames)."""

    size: int


class MkdirRequest(HostApiModel):
    path: str
    parents: bool = True


class RenameRequest(HostApiModel):
    src: str
    dst: str


class WatchBatch(HostApiModel):
    """One EVENT frame of a watch stream (hostport/watch.py)."""

    events: list[WatchEvent]


class WatchDone(HostApiModel):
    """The final RESULT frame of a watch: why it ended ("overflow" came as an event
    before it)."""

    reason: str


# -- code interpreter -----------------------------------------------------------------------


class RunCodeRequest(HostApiModel):
    code: str
    language: str = "python"
    context_id: str | None = None
    timeout: float | None = None
    env: dict[str, str] | None = None


class RunDone(HostApiModel):
    """The final RESULT frame of a code run (its events, "end" last, came before it)."""

    events: int


class CodeContextRequest(HostApiModel):
    language: str = "python"
    cwd: str | None = None


class CodeContext(HostApiModel):
    context: dict[str, Any]


class CodeContextList(HostApiModel):
    contexts: list[dict[str, Any]]


# -- templates ------------------------------------------------------------------------------


class RegistryLoginModel(HostApiModel):
    """A registry login crossing to the host: the password masked in every repr and error
    (`SecretStr`, `hide_input_in_errors`), written out only in the request's JSON."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    username: str = Field(max_length=256)
    password: SecretStr = Field(max_length=8192)

    @field_serializer("password", when_used="json")
    def _send(self, value: SecretStr) -> str:
        return value.get_secret_value()

    def port_value(self) -> RegistryLogin:
        return RegistryLogin(self.username, self.password.get_secret_value())


def logins_model(logins: RegistryLogins | None) -> dict[str, RegistryLoginModel]:
    return {registry: RegistryLoginModel(username=login.username,
                                         password=SecretStr(login.password))
            for registry, login in (logins or {}).items()}


class BuildRequest(HostApiModel):
    spec: TemplateSpec
    network: Network | None = None
    vcpus: int = DEFAULT_VCPUS
    memory_mb: int = DEFAULT_MEMORY_MB
    cache_scope: str = ""
    # by registry host[:port] as image references name it (docker.io for Docker Hub)
    registry_logins: dict[str, RegistryLoginModel] = Field(default_factory=dict,
                                                           max_length=64)


class PruneRequest(HostApiModel):
    keep_newest: int


class Pruned(HostApiModel):
    deleted: list[str]


class InspectImageRequest(HostApiModel):
    # An image reference is at most a registry host, a 255-character repository and a tag
    # or digest: 1 KiB is more than any.
    reference: str = Field(min_length=1, max_length=1024)
    registry_logins: dict[str, RegistryLoginModel] = Field(default_factory=dict,
                                                           max_length=64)
