"""What host port operations return: plain frozen values, the same whether the host is in
this process or behind the host API. They are also the host API's models of themselves:
pydantic reads and writes these dataclasses as they are (`host_api.codec.adapter`), so each
result has one definition. The guest's listings answer with the guest protocol's own
dataclasses (a row's `answer` in `guestproto.ops`), read from the guest's answer as they are."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_ms: float
    timed_out: bool
    signal: int | None
    truncated: bool


@dataclass(frozen=True)
class FileInfo:
    name: str
    path: str
    type: str
    size: int
    mode: int
    mtime: float


@dataclass(frozen=True)
class GuestMetrics:
    """The guest's own CPU, memory and root-disk use (guest op `metrics`): CPU use is the
    non-idle share of all its CPUs over `window_ms`, memory used is MemTotal - MemAvailable."""

    cpu_percent: float
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    disk_used_bytes: int
    disk_total_bytes: int
    window_ms: int


@dataclass
class CodeEvent:
    type: str  # "stdout" | "stderr" | "result" | "error" | "end"
    text: str = ""
    data: dict[str, str] | None = None  # result: mime type -> str (images base64)
    is_main_result: bool = False  # the value of the last expression, not a display()
    name: str = ""
    value: str = ""
    traceback: str = ""
    execution_count: int | None = None


@dataclass(frozen=True)
class SnapshotInfo:
    id: str
    name: str | None
    source: str
    template: str
    template_path: str
    vcpus: int
    memory_mb: int
    disk_bytes: int
    layers: tuple[str, ...]
    created_at: float
    state_bytes: int
    internal: bool = False
    size_bytes: int = 0  # allocated bytes of the stream and the layers (shared ones included)
    # Deleted as soon as its sandboxes run (a fork's): one found at start is a crash's leftover.
    transient: bool = False
    # The volumes its sandbox had mounted, with the copies it keeps of read-write ones
    # (host/volumes/attach.py `keep_copies`).
    volumes: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class SnapshotResult:
    info: SnapshotInfo
    pause_ms: float
    method: str = "stopped"  # how the memory was saved (vmm.SnapshotPause)


class ForkChildren(list[T]):
    """What a host's `fork` returns: the children, and how long the parent stood still for
    the fork's snapshot (its pause window as the VMM measured it; None where the host does
    not say, e.g. behind the host API)."""

    def __init__(self, children: Iterable[T], parent_pause_ms: float | None) -> None:
        super().__init__(children)
        self.parent_pause_ms = parent_pause_ms


def parent_pause_of(children: Sequence[object]) -> float | None:
    """The parent's pause a fork's answer carries, if its host reported one."""
    return children.parent_pause_ms if isinstance(children, ForkChildren) else None


@dataclass(frozen=True)
class BuildResult:
    """`snapshot_id`: create sandboxes from it. `env`, `workdir` and `user` are what the
    template's later commands should run with (the start command already does).
    `exposed_ports`: the ExposedPorts of the image the template was built FROM ("8080/tcp";
    empty FROM a template; a default, so an agent of before them still answers).
    `size_bytes`: what the template keeps on the host, its snapshot's files and (FROM an
    image) the guest disk image made of it, as allocated on disk: the team's
    max_template_gb counts it (0 from an agent of before it)."""

    snapshot_id: str
    env: dict[str, str]
    workdir: str | None
    user: str | None
    start: str | None
    steps_total: int
    steps_cached: int
    seconds: float
    exposed_ports: tuple[str, ...] = ()
    size_bytes: int = 0


@dataclass(frozen=True)
class ImageInfo:
    """What an image's registry says of it now (`inspect_image`): the reference spelled out
    (`python:3.12-slim` is `docker.io/library/python:3.12-slim`), the digest it names, its
    linux/amd64 manifest's, its layers' count and compressed bytes, its config's
    ExposedPorts."""

    reference: str
    digest: str
    manifest_digest: str
    layers: int
    size: int
    exposed_ports: tuple[str, ...] = ()


# A live migration's offer, ticket or handoff (ADR 0023): JSON made and read by the hosts;
# the control plane only carries it from one to the other (and reads a handoff's
# "downtime_ms", "total_ms", "bytes" and "method").
MigrationDocument = dict[str, Any]
# A snapshot transfer's offer or ticket (ADR 0024): the hosts' own JSON.
TransferDocument = dict[str, Any]
