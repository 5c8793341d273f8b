"""Wire types of the REST API's sandboxes and what runs in them (exec, processes, files,
metrics, code), shared by the server and the SDK.

Field names here are the JSON field names. Everything a client sends is validated here first:
unknown fields are rejected, sizes and ranges are bounded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from pandastack.rules import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TTL_SECONDS,
    DEFAULT_VCPUS,
    MAX_DISK_MB,
    MAX_ENV_ITEMS,
    MAX_EXEC_OUTPUT_MB,
    MAX_EXEC_TIMEOUT_SECONDS,
    MAX_FORK,
    MAX_MEMORY_MB,
    MAX_METADATA_ITEMS,
    MAX_NETWORK_RULES,
    MAX_TTL_SECONDS,
    MAX_VCPUS,
    MAX_VOLUMES_PER_SANDBOX,
    MIN_DISK_MB,
    MIN_MEMORY_MB,
    MIN_VCPUS,
    SANDBOX_ID_RE,
    SANDBOX_NAME_PATTERN,
    VOLUME_NAME_PATTERN,
    ErrorCode,
)
from pandastack.wire.base import Strict

# What a client gets back from this part of the API: `pandastack.sdk.models` re-exports
# these (`import *`), so a new result model is named here, beside its class.
__all__ = [
    "AttachedVolume",
    "CodeContext",
    "CodeError",
    "ExecResult",
    "FileEntry",
    "ForkResult",
    "Lifecycle",
    "Logs",
    "NetworkSpec",
    "ProcessInfo",
    "SandboxInfo",
    "SandboxMetrics",
    "SandboxState",
    "SnapshotInfo",
    "VolumeMount",
    "WriteResult",
]

SandboxState = Literal["starting", "running", "paused", "hibernated", "stopped", "killed",
                       "expired", "reaped", "failed", "host_lost"]
#: How a stopped sandbox came back (ADR 0037): its hibernation, its newest snapshot of
#: itself, or a boot of its own disk (files kept, processes not).
RestoredFrom = Literal["hibernation", "snapshot", "disk"]
ENDED_STATES: frozenset[str] = frozenset({"killed", "expired", "reaped", "failed"})


# -- errors -------------------------------------------------------------------------------


class ErrorBody(Strict):
    code: ErrorCode
    message: str
    request_id: str
    # quota_exceeded only (absent otherwise): which limit, its value, the use it would cross.
    limit: str | None = None
    value: float | None = None
    current: float | None = None

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Every other error's body stays {code, message, request_id}.
        body: dict[str, Any] = handler(self)
        return {k: v for k, v in body.items()
                if v is not None or k not in ("limit", "value", "current")}


class ErrorEnvelope(Strict):
    """Every non-2xx response has exactly this body: {"error": {code, message, request_id}}."""

    error: ErrorBody


# -- sandboxes ----------------------------------------------------------------------------

# -- network ------------------------------------------------------------------------------

#: A CIDR (`203.0.113.0/24`, `198.51.100.7`) or a domain name (`pypi.org`).
NetworkRule = Annotated[str, Field(min_length=1, max_length=253)]


class NetworkSpec(Strict):
    """A sandbox's egress policy, enforced on the host (outside the guest).

    `allow_out` entries win over `deny_out` and over `internet: false`, but never open the
    always-denied ranges: private (10/8, 172.16/12, 192.168/16), loopback, link-local and
    cloud metadata (169.254/16), CGNAT (100.64/10), multicast and reserved, the host's own
    addresses and other sandboxes. A CIDR entry reaching into them (`0.0.0.0/0`,
    `10.0.0.0/8`, `169.254.169.254/32`...) is refused with 422, unless that part lies in the
    ranges the server's operator lets tenants open (`PANDASTACK_NETWORK_OPERATOR_ALLOW`).
    Domain names are judged on TCP 80/443 by the host's egress proxy, by the TLS SNI or HTTP
    Host the guest sends (a forged DNS answer changes nothing), and a name whose addresses
    are always denied reaches nothing. Nothing outside the sandbox opens a connection into
    it but the API's port proxy."""

    internet: bool = Field(default=True, description="Whether public addresses are reachable "
                           "(any port); the always-denied ranges never are.")
    allow_out: list[NetworkRule] = Field(
        default_factory=list, max_length=MAX_NETWORK_RULES,
        description="CIDRs (any port) or domain names (TCP 80/443, by TLS SNI or HTTP Host) "
                    "reachable even with `internet: false` and over `deny_out`. Only public "
                    "addresses, plus the parts of the always-denied ranges (private, "
                    "loopback, link-local/metadata, CGNAT, multicast) that the operator "
                    "lists: a CIDR reaching into any other part of them is refused (422).")
    deny_out: list[NetworkRule] = Field(
        default_factory=list, max_length=MAX_NETWORK_RULES,
        description="CIDRs (any port) or domain names (TCP 80/443) closed although "
                    "`internet` is on.")


class VolumeMount(Strict):
    """A team volume to mount in a new sandbox (`CreateSandbox.volumes`)."""

    name: str = Field(pattern=VOLUME_NAME_PATTERN)
    mount_path: str = Field(min_length=2, max_length=1024, pattern=r"^/[^\x00]*$")
    read_only: bool = False


class AttachedVolume(Strict):
    """A volume a sandbox has mounted (a fork's child: its own copy, under a new name)."""

    id: str
    name: str
    mount_path: str
    read_only: bool


class CreateSandbox(Strict):
    template: str | None = Field(default=None, max_length=128)
    snapshot: str | None = Field(default=None, max_length=128)
    ttl_seconds: int = Field(default=DEFAULT_TTL_SECONDS, ge=1, le=MAX_TTL_SECONDS)
    persistent: bool = False
    vcpus: int = Field(default=DEFAULT_VCPUS, ge=MIN_VCPUS, le=MAX_VCPUS)
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    disk_mb: int | None = Field(default=None, ge=MIN_DISK_MB, le=MAX_DISK_MB)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ITEMS)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=MAX_METADATA_ITEMS)
    network: NetworkSpec | None = None  # None: the default policy (internet on, no lists)
    volumes: list[VolumeMount] = Field(default_factory=list,
                                       max_length=MAX_VOLUMES_PER_SANDBOX)
    # Admin keys only: place the sandbox on this host (where the server drives many).
    host_id: str | None = Field(default=None, max_length=64)
    name: str | None = Field(
        default=None, pattern=SANDBOX_NAME_PATTERN,
        description="the team's name for it, unique among its sandboxes that have not "
                    "ended (409 otherwise); `PUT /v1/sandboxes/by-name/{name}` gets or makes "
                    "one; never of the form sbx-<12 hex>")

    @field_validator("name")
    @classmethod
    def _not_an_id(cls, value: str | None) -> str | None:
        if value is not None and SANDBOX_ID_RE.match(value):
            raise ValueError("a name must not have a sandbox id's form (sbx-<12 hex>)")
        return value


class SandboxInfo(Strict):
    id: str
    template: str
    state: SandboxState
    created_at: float
    expires_at: float | None
    ttl_seconds: int
    persistent: bool
    vcpus: int
    memory_mb: int
    disk_mb: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    ended_at: float | None = None
    end_reason: str | None = None
    snapshot: str | None = None  # the snapshot it was created from, if any
    host_id: str | None = None  # the host it runs on, where the server drives many
    volumes: list[AttachedVolume] = Field(default_factory=list)
    name: str | None = None  # the team's name for it, if it was given one
    stop_reason: str | None = Field(
        default=None, description="state stopped: why its VM ended (a wake, or any request "
                                  "that needs the VM, starts it again)")
    restored_from: RestoredFrom | None = Field(
        default=None, description="after a stopped sandbox was started again: from its "
                                  "hibernation, its newest snapshot, or a boot of its own "
                                  "disk (files kept, processes not)")


class SandboxList(Strict):
    sandboxes: list[SandboxInfo]
    next_token: str | None = Field(
        default=None, description="with limit=: pass it back as next_token= for the next "
                                  "page; null on the last page")


class Lifecycle(Strict):
    ttl_seconds: int
    persistent: bool
    created_at: float
    expires_at: float | None
    last_activity_at: float
    idle_timeout_seconds: int
    state: SandboxState


class UpdateLifecycle(Strict):
    ttl_seconds: int | None = Field(default=None, ge=1, le=MAX_TTL_SECONDS)
    timeout_seconds: int | None = Field(
        default=None, ge=0, le=MAX_TTL_SECONDS,
        description="end the sandbox this many seconds from now: expires_at = now + "
                    "timeout_seconds, and ttl_seconds becomes expires_at - created_at "
                    "(rounded up). Not with ttl_seconds")
    persistent: bool | None = None


class Logs(Strict):
    console: str
    agent: str


# -- snapshots and fork ------------------------------------------------------------------

class SnapshotInfo(Strict):
    """A snapshot of a sandbox's memory, device state and disk; it belongs to the team."""

    id: str
    name: str | None = None
    source_sandbox: str | None = None
    template: str
    created_at: float
    vcpus: int
    memory_mb: int
    disk_mb: int | None = None
    size_bytes: int = 0


class SnapshotList(Strict):
    snapshots: list[SnapshotInfo]


class CreateSnapshot(Strict):
    name: str | None = Field(default=None, max_length=128)


class ForkRequest(Strict):
    count: int = Field(default=1, ge=1, le=MAX_FORK)
    # Admin keys only: place the children on this host (where the server drives many).
    host_id: str | None = Field(default=None, max_length=64)
    # Onto another host: through the object store (a snapshot saved there first) rather
    # than streamed from host to host; slower, but it needs only the store to be up.
    durable: bool = False


class ForkResult(Strict):
    """The children, in no particular order; each is a new sandbox of the parent's team."""

    parent: str
    sandboxes: list[SandboxInfo]
    duration_ms: float = 0.0
    parent_pause_ms: float | None = Field(
        default=None, description="How long the parent stood still for the fork's snapshot "
        "(its guest stopped), as the host measured it; null where the host does not say.")


# -- exposed ports ------------------------------------------------------------------------

MAX_SIGNED_URL_TTL_SECONDS = 7 * 24 * 3600


class SignedUrlRequest(Strict):
    ttl_seconds: int = Field(default=3600, ge=1, le=MAX_SIGNED_URL_TTL_SECONDS)


class SignedUrl(Strict):
    """A URL that reaches the port without an API key until `expires_at` (UNIX seconds)."""

    url: str
    expires_at: float


# -- exec and processes -------------------------------------------------------------------

class ExecRequest(Strict):
    cmd: str | list[str] = Field(min_length=1)
    timeout_seconds: float = Field(default=60, gt=0, le=MAX_EXEC_TIMEOUT_SECONDS)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ITEMS)
    cwd: str | None = Field(default=None, max_length=4096)
    stdin: str | None = None
    max_output_bytes: int | None = Field(
        default=None, ge=0, le=MAX_EXEC_OUTPUT_MB << 20,
        description="bytes of each of stdout and stderr the result keeps (a stream: sends); "
                    "past it the result says truncated=true. Default: the server's "
                    "PANDASTACK_MAX_EXEC_OUTPUT_MB; more than that is 422")


class ExecResult(Strict):
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool = False
    signal: int | None = None
    truncated: bool = False


class StartProcess(Strict):
    cmd: str | list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ITEMS)
    cwd: str | None = Field(default=None, max_length=4096)
    timeout_seconds: float | None = Field(
        default=None, gt=0, le=MAX_TTL_SECONDS,
        description="kill the process (its whole cgroup) after this long; its exit then "
                    "has timed_out=true (code 137). Default: it runs as long as the sandbox")


class ProcessInfo(Strict):
    pid: int
    cmd: str | list[str]
    running: bool
    exit_code: int | None = None
    timed_out: bool = False


class ProcessList(Strict):
    processes: list[ProcessInfo]


class SignalRequest(Strict):
    signal: int = Field(ge=1, le=64)


# -- files --------------------------------------------------------------------------------

FileType = Literal["file", "dir", "symlink", "other"]


class FileEntry(Strict):
    name: str
    path: str
    type: FileType
    size: int
    mode: int
    mtime: float


class FileList(Strict):
    entries: list[FileEntry]


class WriteResult(Strict):
    path: str
    size: int


MAX_WRITE_MANY_FILES = 1000
"""Files one `files/batch` request writes (its JSON body is bounded by the body limit)."""


class WriteManyFile(Strict):
    path: str = Field(min_length=1, max_length=4096)
    data: str = Field(description="the content: UTF-8 text, or base64 with encoding=base64")
    encoding: Literal["utf-8", "base64"] = "utf-8"
    mode: int | None = Field(None, ge=0, le=0o7777, description="permission bits (an int)")


class WriteManyRequest(Strict):
    files: list[WriteManyFile] = Field(min_length=1, max_length=MAX_WRITE_MANY_FILES)


class WriteManyResult(Strict):
    files: list[WriteResult]


FileEventType = Literal["create", "write", "remove", "rename", "chmod", "overflow"]


class FileEvent(Strict):
    """One event of a file watch (`GET .../files/watch`)."""

    type: FileEventType
    path: str
    old_path: str | None = Field(None, description="rename: the path it had before")
    is_dir: bool = False


# -- metrics ------------------------------------------------------------------------------

class SandboxMetrics(Strict):
    """What the guest measured as it answered: nothing is sampled between requests."""

    cpu_percent: float = Field(description="non-idle share of all the guest's CPUs over "
                                           "`window_ms` (0-100)")
    cpu_count: int
    memory_used_bytes: int = Field(description="MemTotal - MemAvailable in the guest")
    memory_total_bytes: int
    disk_used_bytes: int = Field(description="of the guest's root file system")
    disk_total_bytes: int
    window_ms: int = Field(description="how long the CPU use was measured")
    sampled_at: float = Field(description="UNIX seconds, when the answer came")


class MkdirRequest(Strict):
    path: str = Field(min_length=1, max_length=4096)
    parents: bool = True


class RenameRequest(Strict):
    src: str = Field(min_length=1, max_length=4096)
    dst: str = Field(min_length=1, max_length=4096)


# -- code interpreter ---------------------------------------------------------------------

MAX_CODE_CHARS = 1024 * 1024
CodeLanguage = Literal["python", "bash", "javascript"]


class RunCode(Strict):
    """Run `code` in a code context (the language's default context when `context_id` is
    not given). State (variables, imports, cwd) persists between runs in one context."""

    code: str = Field(max_length=MAX_CODE_CHARS)
    language: CodeLanguage = "python"
    context_id: str | None = Field(default=None, min_length=1, max_length=64)
    timeout_seconds: float = Field(default=300, gt=0, le=MAX_EXEC_TIMEOUT_SECONDS)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ITEMS)


class CodeResult(Strict):
    """One rich output: `data` maps a MIME type to its content (binary types such as
    image/png are base64). `is_main_result` marks the value of the cell's last expression;
    the others come from display calls (a matplotlib figure, `display(...)`)."""

    data: dict[str, str]
    is_main_result: bool = False


class CodeError(Strict):
    name: str
    value: str
    traceback: str


class Execution(Strict):
    stdout: str = ""
    stderr: str = ""
    results: list[CodeResult] = Field(default_factory=list)
    error: CodeError | None = None
    execution_count: int | None = None


class CreateCodeContext(Strict):
    language: CodeLanguage = "python"
    cwd: str | None = Field(default=None, max_length=4096)


class CodeContext(Strict):
    id: str
    language: str
    cwd: str | None = None


class CodeContextList(Strict):
    contexts: list[CodeContext]
