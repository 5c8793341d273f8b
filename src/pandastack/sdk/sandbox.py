"""`Sandbox`: one microVM sandbox, synchronous. The async twin is `AsyncSandbox`.

    from pandastack import Sandbox

    with Sandbox.create(template="base", ttl_seconds=900) as sbx:
        sbx.filesystem.write("/work/step.py", source)
        run = sbx.exec("python /work/step.py", timeout_seconds=600)
        print(run.exit_code, run.stdout)
    # leaving the block kills the sandbox, also when the block raised
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

import httpx

from pandastack.rules import DEFAULT_TEMPLATE
from pandastack.sdk import _base, _metrics, _names, _streams
from pandastack.sdk._code import Language
from pandastack.sdk._forked import Forked
from pandastack.sdk._http import HTTP
from pandastack.sdk._shared_http import shared_http
from pandastack.sdk._streams import SandboxPage
from pandastack.sdk.code import (
    DEFAULT_CODE_TIMEOUT,
    CodeInterpreter,
    EventCallback,
    Execution,
)
from pandastack.sdk.commands import Commands
from pandastack.sdk.config import DEFAULT_TIMEOUT, TimeoutTypes, resolve_config
from pandastack.sdk.errors import NotFoundError, PandastackError, TemplateBuildingError
from pandastack.sdk.filesystem import Filesystem
from pandastack.sdk.models import (
    CodeContext,
    ExecResult,
    Lifecycle,
    Logs,
    NetworkSpec,
    OutputCallback,
    SandboxInfo,
    SandboxMetrics,
)
from pandastack.sdk.pty import Terminals

__all__ = ["Sandbox"]

log = logging.getLogger("pandastack")


def create_waiting(http: HTTP, call: _base.Call[SandboxInfo]) -> SandboxInfo:
    """Send a create; while its template is still building (409 template_building), wait as
    the server asks and send it again, logging progress, for up to TEMPLATE_WAIT_SECONDS."""
    deadline = time.monotonic() + _base.TEMPLATE_WAIT_SECONDS
    while True:
        try:
            return http.run(call)
        except TemplateBuildingError as exc:
            if time.monotonic() >= deadline:
                raise
            log.info("%s; waiting", exc)
            time.sleep(_base.template_retry_delay(exc.retry_after))


def _open(api_url: str | None, api_key: str | None, timeout: TimeoutTypes,
          transport: httpx.BaseTransport | None) -> tuple[HTTP, bool]:
    """The connections for a new handle and whether it owns them: this process's pool for
    the server (sdk/_shared_http.py), or, with a test's `transport`, a pool of its own."""
    config = resolve_config(api_url, api_key, timeout=timeout)
    if transport is None:
        return shared_http(config), False
    return HTTP(config, transport), True


def _first_info(fetch: Callable[[HTTP], SandboxInfo], api_url: str | None,
                api_key: str | None, timeout: TimeoutTypes,
                transport: httpx.BaseTransport | None) -> tuple[SandboxInfo, HTTP, bool]:
    """Run a new handle's first call on its connections (`_open`); connections of its own
    are closed again when that call fails, since no handle will own them then."""
    http, owns = _open(api_url, api_key, timeout, transport)
    try:
        return fetch(http), http, owns
    except BaseException:
        if owns:
            http.close()
        raise


class Sandbox(_base.SandboxBase[HTTP]):
    """A handle on one sandbox. Make one with `create()` or `connect()`, not the constructor.

    Used as a context manager it kills the sandbox on exit (also when the block raised).
    Without one, call `kill()` yourself. Handles made by `create`/`connect`/`list` share this
    process's connections to their server (sdk/_shared_http.py): the next create reuses them.
    """

    def __init__(self, info: SandboxInfo, http: HTTP, *, owns_http: bool = False) -> None:
        super().__init__(info, http, owns_http=owns_http)
        self._commands = Commands(info.id, http)
        self._filesystem = Filesystem(info.id, http)
        self._code = CodeInterpreter(info.id, http)
        self._pty = Terminals(info.id, http)

    @property
    def commands(self) -> Commands:
        """Run commands and drive background processes."""
        return self._commands

    @property
    def pty(self) -> Terminals:
        """Terminals: `create` one (a shell by default), `connect` to one by its pid."""
        return self._pty

    @property
    def code(self) -> CodeInterpreter:
        """The code interpreter: `run`/`stream` code, create and remove code contexts."""
        return self._code

    @property
    def filesystem(self) -> Filesystem:
        """Read, write, list and move files inside the sandbox."""
        return self._filesystem

    @property
    def files(self) -> Filesystem:
        """The same as `filesystem` (the name other sandbox SDKs use)."""
        return self._filesystem

    @classmethod
    def create(cls, template: str = DEFAULT_TEMPLATE, ttl_seconds: int | None = None,
               persistent: bool = False, vcpus: int | None = None,
               memory_mb: int | None = None, env: Mapping[str, str] | None = None,
               metadata: Mapping[str, str] | None = None, *, disk_mb: int | None = None,
               snapshot: str | None = None, network: _base.NetworkArg | None = None,
               volumes: Sequence[_base.VolumeArg] | None = None, name: str | None = None,
               host_id: str | None = None,
               api_url: str | None = None, api_key: str | None = None,
               timeout: TimeoutTypes = DEFAULT_TIMEOUT,
               transport: httpx.BaseTransport | None = None) -> Sandbox:
        """Create a sandbox from `template` (or from `snapshot`) and return its handle.

        `ttl_seconds`: lifetime before the server kills it (server default when None; always
        set it as a backstop). `persistent=True` exempts it from the idle reaper. `vcpus`,
        `memory_mb`, `disk_mb`: resources (server defaults when None). `env`: environment of
        every command. `metadata`: labels to filter `list()` by. `snapshot`: a snapshot id (see
        `snapshot()`): the sandbox resumes its memory, processes and files, and its template,
        `vcpus` and `memory_mb` are the snapshot's. `network`: the egress policy,
        `{"internet": bool, "allow_out": [...], "deny_out": [...]}` with CIDRs or domain names
        (default: internet on; see `update_network()`). `volumes`: team volumes to mount,
        `[{"name": "data", "mount_path": "/data", "read_only": False}]` (one sandbox may
        mount a volume read-write at a time: `VolumeInUseError`; see `Client.volumes`). A
        sandbox from a snapshot gets the snapshot's volumes (copies of read-write ones).
        `name`: the team's name for it (unique among its sandboxes that have not ended:
        `ConflictError` otherwise; see `get_or_create`). `host_id`: the host to place it on
        (admin keys only, where the server drives many hosts; see `Client.hosts`).
        `api_url`/`api_key` override
        the environment and config file; `timeout` is the HTTP timeout of ordinary requests;
        `transport` replaces httpx's (for tests).
        """
        call = _base.create_sandbox_call(template=template, ttl_seconds=ttl_seconds,
                                         persistent=persistent, vcpus=vcpus,
                                         memory_mb=memory_mb, disk_mb=disk_mb, env=env,
                                         metadata=metadata, snapshot=snapshot,
                                         network=network, volumes=volumes, name=name,
                                         host_id=host_id)
        info, http, owns = _first_info(lambda h: create_waiting(h, call), api_url, api_key,
                                       timeout, transport)
        return cls(info, http, owns_http=owns)

    @classmethod
    def get_or_create(cls, name: str, template: str = DEFAULT_TEMPLATE,
                      ttl_seconds: int | None = None, persistent: bool = False,
                      vcpus: int | None = None, memory_mb: int | None = None,
                      env: Mapping[str, str] | None = None,
                      metadata: Mapping[str, str] | None = None, *, disk_mb: int | None = None,
                      snapshot: str | None = None, network: _base.NetworkArg | None = None,
                      volumes: Sequence[_base.VolumeArg] | None = None,
                      host_id: str | None = None,
                      api_url: str | None = None, api_key: str | None = None,
                      timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                      transport: httpx.BaseTransport | None = None) -> Sandbox:
        """The team's live sandbox named `name` (a hibernated one woken), or a new one made
        with these options (those of `create`). Concurrent calls with one name get one
        sandbox; an ended sandbox frees its name, so the next call makes a new one."""
        call = _names.get_or_create_call(_base.create_sandbox_call(
            template=template, ttl_seconds=ttl_seconds, persistent=persistent, vcpus=vcpus,
            memory_mb=memory_mb, disk_mb=disk_mb, env=env, metadata=metadata,
            snapshot=snapshot, network=network, volumes=volumes, name=name,
            host_id=host_id), name)
        info, http, owns = _first_info(lambda h: create_waiting(h, call), api_url, api_key,
                                       timeout, transport)
        return cls(info, http, owns_http=owns)

    @classmethod
    def connect(cls, sandbox_id: str, *, api_url: str | None = None,
                api_key: str | None = None, timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                transport: httpx.BaseTransport | None = None) -> Sandbox:
        """A handle on the existing sandbox `sandbox_id` (`NotFoundError` if there is none).

        Note that using it as a context manager kills the sandbox on exit; call `close()`
        instead to just drop the handle.
        """
        call = _base.get_sandbox_call(sandbox_id)  # an id, or the team's name for one
        info, http, owns = _first_info(lambda h: h.run(call), api_url, api_key, timeout, transport)
        return cls(info, http, owns_http=owns)

    @classmethod
    def list(cls, state: str | None = None, metadata: Mapping[str, str] | None = None, *,
             include_ended: bool = False, template: str | None = None,
             started_after: float | datetime.datetime | None = None, limit: int | None = None,
             next_token: str | None = None, api_url: str | None = None,
             api_key: str | None = None, timeout: TimeoutTypes = DEFAULT_TIMEOUT,
             transport: httpx.BaseTransport | None = None) -> SandboxPage[Sandbox]:
        """The sandboxes of this key's team, oldest first: the live ones (starting, running,
        paused, hibernated), or every one with `include_ended=True`, or those in `state` (ended
        or not); only those carrying every `metadata` label given, of `template`, created after
        `started_after` (Unix seconds or an aware datetime). With `limit`, one page of at most
        that many: its `next_token` (None on the last page) passed back with the same filters
        gives the next (keyset-paged: creations and ends meanwhile never skip or repeat one).
        Each item is a handle on this process's connections to the server (those `create`
        uses too): use or `kill()` it without another lookup (as a context manager it kills
        the sandbox on exit)."""
        call = _streams.list_page_call(state, metadata, include_ended, template=template,
                                       started_after=started_after, limit=limit,
                                       next_token=next_token)
        http, owns = _open(api_url, api_key, timeout, transport)
        try:
            infos, token = http.run(call)
        finally:
            if owns:
                http.close()
        return SandboxPage([cls(info, http.sibling(), owns_http=True) if owns else cls(info, http)
                            for info in infos], token)

    def refresh(self) -> SandboxInfo:
        """Fetch the sandbox's current state; also updates `info`."""
        self._info = self._http.run(_base.get_sandbox_call(self.id))
        return self._info

    def exec(self, cmd: str | Sequence[str], timeout_seconds: float = 60,
             env: Mapping[str, str] | None = None, cwd: str | None = None,
             stdin: str | None = None, on_stdout: OutputCallback | None = None,
             on_stderr: OutputCallback | None = None,
             max_output_bytes: int | None = None) -> ExecResult:
        """Run `cmd` to completion; same as `commands.run()` (see there)."""
        return self._commands.run(cmd, timeout_seconds=timeout_seconds, env=env, cwd=cwd,
                                  stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                                  max_output_bytes=max_output_bytes)

    def run_code(self, code: str, language: Language = "python",
                 context: str | CodeContext | None = None,
                 timeout_seconds: float = DEFAULT_CODE_TIMEOUT,
                 env: Mapping[str, str] | None = None,
                 on_event: EventCallback | None = None) -> Execution:
        """Run `code` in the sandbox's kernel; same as `code.run()` (see there). State persists
        between calls: a variable defined in one call is visible in the next."""
        return self._code.run(code, language=language, context=context,
                              timeout_seconds=timeout_seconds, env=env, on_event=on_event)

    def pause(self) -> SandboxInfo:
        """Stop the sandbox's vCPUs in place, state intact; commands and file operations fail
        (`ConflictError`) until `resume()`. Returns the new state (also in `info`)."""
        self._info = self._http.run(_base.state_call(self.id, "pause"))
        return self._info

    def resume(self) -> SandboxInfo:
        """Restart the vCPUs of a paused sandbox. Returns the new state (also in `info`)."""
        self._info = self._http.run(_base.state_call(self.id, "resume"))
        return self._info

    def hibernate(self) -> SandboxInfo:
        """Write the sandbox's whole state to disk and end its VM, freeing RAM and CPU. Any
        later request (a command, a file operation, `wake()`) brings it back with its processes
        and files. Returns the new state (also in `info`)."""
        self._info = self._http.run(_base.state_call(self.id, "hibernate"))
        return self._info

    def wake(self) -> SandboxInfo:
        """Bring a hibernated sandbox back now, or start a stopped one (its VM died: see
        `info.restored_from` for what it came back from); any request would too. A no-op if
        it is awake. Returns the new state (also in `info`)."""
        self._info = self._http.run(_base.state_call(self.id, "wake"))
        return self._info

    def snapshot(self, name: str | None = None) -> str:
        """Capture the sandbox's memory, processes and disk, and return the snapshot id; the
        sandbox keeps running. `Sandbox.create(snapshot=id)` restores it, any number of times;
        `client.snapshots` lists, inspects and deletes snapshots (they belong to the team)."""
        return (self._http.run(_base.snapshot_call(self.id, name))).id

    def fork(self, count: int = 1, *, durable: bool = False,
             host_id: str | None = None) -> Forked[Sandbox]:
        """`count` (1 to 16) live copies of the sandbox, each with the parent's memory, running
        processes and files as they were at the fork instant and its own id, hostname and
        machine-id; the parent keeps running. Each child is a new sandbox with the parent's
        TTL, persistence, env and metadata; kill it (or use it as a context manager) when
        done: leaving the parent's `with` block does not kill the children. `durable`:
        children placed on another host come from a snapshot saved in the object store
        rather than streamed from the parent's host. `host_id`: the host to place the
        children on (admin keys only, where the server drives many hosts). The list also
        carries the parent's pause for the fork's snapshot (`parent_pause_ms`) and the
        server's time for the fork (`duration_ms`)."""
        result = self._http.run(_base.fork_call(self.id, count, durable=durable,
                                                host_id=host_id))
        return Forked((self._child(info) for info in result.sandboxes), result)

    def _child(self, info: SandboxInfo) -> Sandbox:
        """A handle on a fork child: its own connections if this handle owns its own."""
        if self._owns_http:
            return Sandbox(info, self._http.sibling(), owns_http=True)
        return Sandbox(info, self._http)

    def lifecycle(self) -> Lifecycle:
        """TTL, persistence, expiry and last activity of the sandbox."""
        return self._http.run(_base.lifecycle_call(self.id))

    def set_ttl(self, seconds: int) -> Lifecycle:
        """Set the time to live, counted from the sandbox's creation (`expires_at =
        created_at + seconds`); returns the new lifecycle. `set_timeout` counts from now."""
        return self._http.run(_base.update_lifecycle_call(self.id, ttl_seconds=seconds))

    def set_timeout(self, seconds: int) -> Lifecycle:
        """End the sandbox `seconds` from now (E2B's meaning), whatever its age; the TTL
        becomes the one that ends then. Returns the new lifecycle."""
        return self._http.run(_streams.set_timeout_call(self.id, seconds))

    def is_running(self) -> bool:
        """Whether the sandbox is running now (one GET; also updates `info`). False when it is
        paused, hibernated, ended or gone."""
        try:
            return self.refresh().state == "running"
        except NotFoundError:
            return False

    def set_persistent(self, flag: bool) -> Lifecycle:
        """Exempt the sandbox from the idle reaper (True) or not (False)."""
        return self._http.run(_base.update_lifecycle_call(self.id, persistent=flag))

    def network(self) -> NetworkSpec:
        """The sandbox's egress policy."""
        return self._http.run(_base.network_call(self.id))

    def update_network(self, network: _base.NetworkArg) -> NetworkSpec:
        """Replace the egress policy with `network` (a `NetworkSpec` or a mapping of its
        fields; fields left out take their defaults: internet on, empty lists). Entries are
        CIDRs or domain names; `allow_out` wins over `deny_out` and over `internet: False`,
        but never opens the always-denied ranges (private, loopback, link-local/metadata,
        CGNAT, multicast, other sandboxes, the host): a CIDR reaching into them is refused
        (422, `InvalidRequestError`) unless the server's operator lets tenants open that part.
        New connections follow it at once. Returns the policy."""
        return self._http.run(_base.update_network_call(self.id, network))

    def get_url(self, port: int) -> str:
        """The API address of TCP `port` inside the sandbox, e.g. for a web server started
        in it: HTTP requests to it (any path after its `/`) reach that server and need this
        handle's API key (`Authorization: Bearer ...`). No request is made."""
        return _base.port_url(self._http.config.api_url, self.id, port)

    def signed_url(self, port: int, ttl_seconds: int = 3600) -> str:
        """A URL of TCP `port` inside the sandbox that works without an API key (in a
        browser, say) for `ttl_seconds` (up to 7 days), on the port's own origin
        (`{port}-{id}.{preview domain}`: its cookies and storage are its own); anyone
        holding it can use it until then. Append any path after its `/` (keep the query
        string); the page's own requests need no parameters (a cookie of that host)."""
        return (self._http.run(_base.signed_url_call(self.id, port, ttl_seconds))).url

    def logs(self) -> Logs:
        """The guest console log and the guest agent's log."""
        return self._http.run(_base.logs_call(self.id))

    def get_metrics(self, window_ms: int = _metrics.DEFAULT_WINDOW_MS) -> SandboxMetrics:
        """CPU use (over `window_ms`, 10-2000: the call takes that long), memory and root
        disk, measured in the guest now. A paused or hibernated sandbox gets ConflictError
        (reading metrics does not wake it)."""
        return self._http.run(_metrics.metrics_call(self.id, window_ms))

    def kill(self) -> None:
        """Kill the sandbox. Idempotent: a sandbox that is already gone counts as killed."""
        if self._killed:
            return
        with contextlib.suppress(NotFoundError):
            self._http.run(_base.kill_sandbox_call(self.id))
        self._killed = True

    def close(self) -> None:
        """Release the HTTP connections this handle opened (does not kill the sandbox)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self.kill()
            else:
                try:
                    self.kill()
                except PandastackError as kill_error:
                    # Do not mask the block's exception; the TTL is the backstop.
                    log.warning("could not kill sandbox %s on exit: %s", self.id, kill_error)
        finally:
            self.close()
