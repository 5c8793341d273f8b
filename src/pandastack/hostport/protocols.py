"""The host port: everything the control plane may ask of one host, and nothing more.

Two implementations: `pandastack.host.local.LocalHost` (the runtime in this process) and
`pandastack.server.hostclient.HostClient` (a `pandastack agent` process reached over the host
API, spec/host-openapi.json). Both raise the errors of `hostport.errors`; a host that cannot
be reached raises `HostUnavailable`. Everything is async, lookups included, because for the
client every call is a round trip.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pandastack.guestproto.ops import METRICS_WINDOW_MS, WRITE_FILE_MODE, GlobResult, GrepResult
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_TEMPLATE, DEFAULT_VCPUS
from pandastack.templatespec import TemplateSpec

from .network import NetworkPolicy
from .pty import PtySession
from .registries import RegistryLogins
from .results import (
    BuildResult,
    CodeEvent,
    ExecResult,
    FileInfo,
    GuestMetrics,
    ImageInfo,
    MigrationDocument,
    SnapshotInfo,
    SnapshotResult,
    TransferDocument,
)
from .volumes import VolumeMountRequest
from .watch import WatchEvent

OutputCallback = Callable[[bytes], Awaitable[None] | None]
DroppedCallback = Callable[[int, int], Awaitable[None] | None]
"""(stdout_dropped, stderr_dropped): what a process's rings lost before an attach's backlog."""
PidCallback = Callable[[int], Awaitable[None] | None]
"""A process's pid, told as soon as it started (before its output)."""
BuildLog = Callable[[str], None]


@dataclass(frozen=True)
class SandboxPlacement:
    """Where a sandbox's network is on its host. `ns_ip`: the address that reaches the
    guest's TCP ports from that host (None without a network)."""

    network: NetworkPolicy | None
    ns_ip: str | None


class GuestListings(Protocol):
    """The guest's listings (guest operations whose row has an `answer`: guestproto.ops), as
    the port has them. The sandbox handle's are built from the guest table
    (host/agentlink/bound.py `add_listings`); their arguments are the request's fields."""

    async def grep(self, path: str, pattern: str, *, ignore_case: bool = False) -> GrepResult:
        """The lines holding the literal `pattern` in the files under `path`, searched by the
        guest's own walk within guestproto.ops' GREP_* bounds (spec/guest-protocol.md §5)."""
        ...

    async def glob(self, path: str, pattern: str) -> GlobResult:
        """The paths under `path` that `pattern` (`*`, `?`, `**`, relative) matches, sorted."""
        ...


class SandboxPort(GuestListings, Protocol):
    """One sandbox on a host. `state` and `is_alive()` describe it as of the lookup that
    returned this object (in-process: as of now)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str:
        """"running", "paused", "hibernated" (no VM process; a guest operation wakes it) or
        "stopped" (its VM died, its disk kept; only `RuntimePort.wake` boots it: ADR 0037)."""
        ...

    def is_alive(self) -> bool: ...

    @property
    def forked_from(self) -> str | None:
        """The sandbox this one is a fork child of (None: made from a template or a
        snapshot). A control plane that finds such a child without a row of its own, of a
        parent it knows, knows the child is a leftover of its own fork cut off by a crash."""
        ...

    async def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   stdin: bytes | None = None, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None,
                   user: str | None = None, max_output: int | None = None) -> ExecResult:
        """`max_output`: what the result keeps of each of stdout and stderr (None: the
        host's default, rules.DEFAULT_EXEC_OUTPUT_MB); past it the result says `truncated`.
        The callbacks hear all of it either way."""
        ...

    async def spawn(self, cmd: str | Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, user: str | None = None,
                    timeout: float | None = None) -> int:
        """A background process; `timeout`: its tree is killed after that many seconds."""
        ...

    async def spawn_attach(self, cmd: str | Sequence[str], *, on_spawned: PidCallback,
                           env: Mapping[str, str] | None = None, cwd: str | None = None,
                           user: str | None = None, timeout: float | None = None,
                           stdin: bool = True, on_stdout: OutputCallback | None = None,
                           on_stderr: OutputCallback | None = None,
                           keep_output: bool = True) -> ExecResult:
        """`spawn`, then `attach` to it, in one guest round trip: `on_spawned` hears the pid
        before any output, then the output, then the exit. The process is a background one
        (pid calls reach it; leaving this call only detaches). `stdin=False`: it has none."""
        ...

    async def attach(self, pid: int, *, on_stdout: OutputCallback | None = None,
                     on_stderr: OutputCallback | None = None,
                     on_dropped: DroppedCallback | None = None,
                     keep_output: bool = True) -> ExecResult:
        """The backlog the guest's rings hold (stdout, then stderr), then live output, then
        the exit. `on_dropped` first hears what the rings lost; `keep_output=False` (a
        stream) keeps nothing for the result's stdout/stderr."""
        ...

    async def procs(self) -> list[dict[str, object]]: ...

    async def signal(self, pid: int, sig: int) -> None: ...

    async def send_stdin(self, pid: int, data: bytes, *, eof: bool = False) -> None: ...

    async def pty_create(self, *, cols: int, rows: int, cmd: str | Sequence[str] | None = None,
                         env: Mapping[str, str] | None = None, cwd: str | None = None,
                         user: str | None = None) -> int:
        """A process on a new terminal (`cmd`, or the user's shell): its pid (hostport.pty)."""
        ...

    async def pty_connect(self, pid: int) -> PtySession:
        """Attach to terminal `pid` (GuestOSError ESRCH if none); `close()` it when done."""
        ...

    def read_file(self, path: str) -> AsyncIterator[bytes]: ...

    async def write_file(self, path: str, data: bytes | AsyncIterable[bytes], *,
                         mode: int = WRITE_FILE_MODE) -> int: ...

    async def list_dir(self, path: str) -> list[FileInfo]: ...

    async def stat(self, path: str) -> FileInfo: ...

    async def mkdir(self, path: str, *, parents: bool = True) -> None: ...

    async def remove(self, path: str, *, recursive: bool = False) -> None: ...

    async def rename(self, src: str, dst: str) -> None: ...

    def watch(self, path: str, *, recursive: bool = True) -> AsyncIterator[list[WatchEvent]]:
        """Batches of the file events under directory `path` (hostport/watch.py): the first
        `[watching]` once the watch is set up, the last `[overflow]` if events were lost;
        it ends when the directory is gone, and runs until closed otherwise."""
        ...

    def run_code(self, code: str, *, language: str = "python", context_id: str | None = None,
                 timeout: float | None = None,
                 env: Mapping[str, str] | None = None) -> AsyncIterator[CodeEvent]:
        """The events of one run in a code context; the last one is always "end"."""
        ...

    async def create_code_context(self, language: str = "python",
                                  cwd: str | None = None) -> dict[str, object]: ...

    async def list_code_contexts(self) -> list[dict[str, object]]: ...

    async def delete_code_context(self, context_id: str) -> None: ...

    async def restart_code_context(self, context_id: str) -> None: ...

    async def metrics(self, window_ms: int = METRICS_WINDOW_MS) -> GuestMetrics:
        """CPU use over `window_ms` (within the guest protocol's bounds: guestproto.ops),
        measured by the guest as it answers; memory and root-disk use, all sampled now:
        nothing is measured between calls."""
        ...


class RuntimePort(Protocol):
    """Creates, finds and kills sandboxes; pauses, snapshots, forks and hibernates them; builds
    templates. `start()` re-adopts VMs that are still running, sandboxes that are
    hibernated, and those whose VM died as stopped (idempotent)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def create(self, template: str = DEFAULT_TEMPLATE, *, vcpus: int = DEFAULT_VCPUS,
                     memory_mb: int = DEFAULT_MEMORY_MB,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = ()) -> SandboxPort:
        """`volumes`: mounted before it returns (not with `snapshot`: a snapshot's own
        volumes come with it, read-write ones as copies: see hostport.volumes)."""
        ...

    async def prepare_template(self, name: str, *, vcpus: int = DEFAULT_VCPUS,
                               memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        """Build built-in template `name` for that shape if it is not built yet (minutes on
        a fresh host); TemplateNotFound for unknown names."""
        ...

    async def get(self, sandbox_id: str) -> SandboxPort:
        """SandboxNotFound if the host has no such sandbox."""
        ...

    def handle(self, sandbox_id: str) -> SandboxPort:
        """A handle for guest operations on a sandbox the caller's records say is running,
        made without a round trip to the host (the API's hot path: one lookup fewer per
        request). Its `state` is "running"; if the host has no such sandbox its operations
        raise SandboxNotFound (in-process: at once)."""
        ...

    async def list_sandboxes(self) -> Sequence[SandboxPort]: ...

    async def kill(self, sandbox_id: str) -> None: ...

    async def pause(self, sandbox_id: str) -> None: ...

    async def resume(self, sandbox_id: str) -> None: ...

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult: ...

    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[SandboxPort]: ...

    async def hibernate(self, sandbox_id: str) -> None: ...

    async def wake(self, sandbox_id: str) -> None:
        """Restore a hibernated sandbox, or boot the disk of a stopped one (files kept,
        processes not); a no-op for one whose VM runs."""
        ...

    async def update_network(self, sandbox_id: str, network: NetworkPolicy) -> NetworkPolicy:
        """Replace the egress policy (new connections follow it at once)."""
        ...

    async def placement(self, sandbox_id: str) -> SandboxPlacement: ...

    async def console_log(self, sandbox_id: str, max_bytes: int) -> bytes:
        """The last `max_bytes` of the guest's console (empty if there is none yet)."""
        ...

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        """SnapshotNotFound if the host holds no such snapshot."""
        ...

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]: ...

    async def delete_snapshot(self, snapshot_id: str) -> None: ...

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None,
                             vcpus: int = DEFAULT_VCPUS, memory_mb: int = DEFAULT_MEMORY_MB,
                             cache_scope: str = "",
                             registry_logins: RegistryLogins | None = None) -> BuildResult:
        """Build a template from `spec` , reusing the step
        cache of `cache_scope` (one team's, under one network policy); `log` gets each line
        of output as it comes. BuildFailed names the step that failed. Images are pulled
        with `registry_logins` (by registry; anonymously from the others)."""
        ...

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        """Keep the `keep_newest` most recently used step-cache entries; returns the ids of
        the snapshots deleted."""
        ...

    async def inspect_image(self, reference: str, *,
                            registry_logins: RegistryLogins | None = None) -> ImageInfo:
        """Ask an image's registry for its manifest and config (no layer), within a short
        deadline, with the login `registry_logins` has for that registry (as a build's
        pull): a build FROM an image asks first, so that a missing image, a refused login
        or a registry that does not answer is the build request's error. Raises the
        ImageError subclasses, each naming the image."""
        ...


@runtime_checkable
class MigrationPort(Protocol):
    """Live migration (ADR 0023) between two hosts: steps the control plane drives on the
    source and on the destination in turn. The documents are the hosts' own (JSON the
    control plane carries); the memory goes from host to host directly. One host's port
    (LocalHost, HostClient, LeasedHost) has these; a pool of hosts is no end of a migration.
    """

    async def offer_migration(self, sandbox_id: str) -> MigrationDocument:
        """Source: publish what a destination needs ahead (template, frozen layers); the
        offer to hand to `accept_migration`."""
        ...

    async def accept_migration(self, sandbox_id: str,
                               offer: MigrationDocument) -> MigrationDocument:
        """Destination: be ready for the stream (a stopped VM, a one-shot listener); the
        ticket (address, port, token) to hand to `migrate`."""
        ...

    async def migrate(self, sandbox_id: str, ticket: MigrationDocument) -> MigrationDocument:
        """Source: stream the running sandbox to the ticket's host; on return its guest is
        stopped here. The handoff (for `complete_migration`) says how long it paused."""
        ...

    async def complete_migration(self, sandbox_id: str, handoff: MigrationDocument) -> None:
        """Destination: run the sandbox here (the switch); it is this host's from now on."""
        ...

    async def release_migrated(self, sandbox_id: str) -> None:
        """Source, after the switch: drop this host's copy."""
        ...

    async def abort_migration(self, sandbox_id: str) -> None:
        """Either side, before the switch: the source runs on, the destination keeps
        nothing. SandboxNotFound if this host has no migration of the sandbox."""
        ...


@runtime_checkable
class SnapshotTransferPort(Protocol):
    """A fork's snapshot streamed from one host straight to another (ADR 0024), the state
    never in the object store: steps the control plane drives on the source and the
    destination in turn, carrying the hosts' documents. One host's port (LocalHost,
    HostClient, LeasedHost) has these; a pool of hosts is no end of a transfer."""

    async def offer_snapshot(self, sandbox_id: str) -> TransferDocument:
        """Source: a transient snapshot of the running sandbox (kept until deleted, never
        published); the offer (its info, template, files) for `accept_snapshot`."""
        ...

    async def accept_snapshot(self, offer: TransferDocument) -> TransferDocument:
        """Destination: be ready for the snapshot's files (a one-shot listener); the
        ticket (address, port, token) to hand to `send_snapshot`."""
        ...

    async def send_snapshot(self, snapshot_id: str, ticket: TransferDocument) -> None:
        """Source: stream the snapshot to the ticket's host; on return that host holds it
        as its own (transient) snapshot: create from it there, then delete it on both."""
        ...
