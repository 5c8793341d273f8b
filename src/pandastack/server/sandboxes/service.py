"""The sandbox service, the glue between the store and the runtime: creating, finding, ending
and reconciling sandboxes, pausing, hibernating and waking them, with the team check, the state
check and the activity bookkeeping in one place. The runtime's state of a sandbox is the truth;
the store follows it after every change (and at startup). Snapshots and fork are in
`snapshots.py`; names (`names.py`) and the stopped state (`stopped.py`) take this service as
`parts.ServiceParts` and never import this module."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext, suppress
from typing import Protocol, TypeVar

from pandastack.hostport.errors import (
    HostError,
    HostUnavailable,
    SandboxNotFound,
    TemplateNotFound,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import RuntimePort, SandboxPlacement, SandboxPort
from pandastack.rules import DEFAULT_TEMPLATE, SANDBOX_ID_RE, SNAPSHOT_ID_RE, new_sandbox_id
from pandastack.wire.sandboxes import (
    ENDED_STATES,
    CreateSandbox,
    NetworkSpec,
    SandboxInfo,
)

from ..accounts.quotas import Quotas
from ..accounts.team_slots import TeamSlots
from ..hosts.cluster import ClusterPool
from ..hosts.pinning import pinned_host
from ..settings import Settings
from ..store import Sandbox, Store, TemplateVersion
from ..store.usage import HOLD_AWAKE, HOLD_HIBERNATED
from ..volumes.service import CreatePlan, VolumeService
from ..web.errors import ApiError, api_error_of, bad_request, conflict, host_call, not_found
from ..web.telemetry import timed
from .activity import ActivityTouches
from .names import SandboxNames, claiming
from .stopped import reconcile, reconcile_snapshots, restart_row, stop_row
from .wire_forms import lost, to_info, to_network_spec

log = logging.getLogger("pandastack.server")

AWAKE_STATES = ("running", "paused", "hibernated")
#: The states a request may find a live sandbox in: a stopped one (its VM died, ADR 0037) is
#: started again by whatever needs its VM.
USABLE_STATES = (*AWAKE_STATES, "stopped")
SNAPSHOT_SHAPE = ("template", "vcpus", "memory_mb")
#: How long a create waits for a built-in template that is not built yet before it answers
#: 409 template_building (a template found on disk is ready well within this).
PREPARE_WAIT_SECONDS = 20.0
PREPARE_RETRY_AFTER_SECONDS = 10

T = TypeVar("T")


class TemplateResolver(Protocol):
    async def resolve(self, team: str, ref: str) -> TemplateVersion | None: ...


class SandboxService:
    def __init__(self, store: Store, runtime: RuntimePort, settings: Settings) -> None:
        self.store = store
        self.runtime = runtime
        self.settings = settings
        self.quotas = Quotas(store, settings)
        self.volumes = VolumeService(store, runtime, self.quotas)
        self.names = SandboxNames(self)
        self.exec_slots = TeamSlots(settings.max_execs_per_team, "commands running")
        self.stream_slots = TeamSlots(settings.max_streams_per_team,
                                      "streams and terminals open")
        self._busy: dict[str, int] = {}
        self.activity = ActivityTouches(store)
        self._transitions: dict[str, int] = {}
        # Set by the app when team templates are enabled (`templates.TemplateService`).
        self.templates: TemplateResolver | None = None
        self._preparing: dict[tuple[str, int, int], asyncio.Task[None]] = {}
        # Sandboxes that ended while their host was out of reach: their VMs may still run
        # there (an agent that comes back re-adopts them), so the reaper kills them later.
        self.unkilled: set[str] = set()
        # Set when the host did not answer at startup: the reaper reconciles once it does.
        self.needs_reconcile = False
        # VMs the host runs that this database has no row for, left running at the last
        # reconcile (stopped.reconcile; ADR 0047, addendum).
        self.unknown_vms: list[str] = []
        # The hosts of a shared registry, when this server drives them (else one host).
        self.cluster = runtime if isinstance(runtime, ClusterPool) else None

    # -- lookups --------------------------------------------------------------------------

    def infos(self, rows: Sequence[Sandbox]) -> list[SandboxInfo]:
        """The wire form of the rows, with their volume attachments (one query for all)."""
        live = [r.id for r in rows if r.state not in ENDED_STATES]  # ended: none attached
        attached = self.volumes.attached(live) if live else {}
        return [to_info(r, attached.get(r.id, ())) for r in rows]

    def info(self, row: Sandbox) -> SandboxInfo:
        return self.infos([row])[0]

    def created_info(self, row: Sandbox, req: CreateSandbox) -> SandboxInfo:
        """The wire form of a row `create(req)` returned: one made without volumes or a
        snapshot has no attachments (`create` plans none), so none are read."""
        if req.volumes or req.snapshot is not None:
            return self.info(row)
        return to_info(row)

    def row(self, team: str, sandbox_id: str, *, touch: bool = True) -> Sandbox:
        """The team's sandbox (any state) or 404; bumps its activity time."""
        row = (self.store.get_sandbox(team, sandbox_id)
               if SANDBOX_ID_RE.match(sandbox_id) else None)
        if row is None:
            raise not_found(f"sandbox {sandbox_id!r}")
        if self.cluster is not None and row.state not in ENDED_STATES:
            self.cluster.note_host(row.id, row.host_id)
        if touch and row.state not in ENDED_STATES:
            now = time.time()
            self.activity.touch(row.id, now)
            row.last_activity_at = now
        return row

    def live(self, team: str, sandbox_id: str) -> Sandbox:
        """The team's sandbox that has not ended (a stopped one included): 404 if unknown,
        409 if ended or starting."""
        row = self.row(team, sandbox_id)
        if row.state == "host_lost":
            raise lost(row)
        if row.state not in USABLE_STATES:
            raise conflict(f"sandbox {sandbox_id} is {row.state}, not running")
        return row

    async def running(self, team: str, sandbox_id: str) -> tuple[Sandbox, SandboxPort]:
        """The team's running sandbox and its handle: 404 if unknown, 409 if it ended, is
        paused or is not on this host. A hibernated one is woken first (transparently), and
        a stopped one started again (`restart_row`)."""
        row = self.row(team, sandbox_id)
        if row.state in ("hibernated", "stopped"):
            row = await self.wake_row(row)
        if row.state == "host_lost":
            raise lost(row)
        if row.state != "running":
            raise conflict(f"sandbox {sandbox_id} is {row.state}, not running")
        try:
            return row, self.runtime.handle(row.id)
        except SandboxNotFound:
            raise conflict(f"sandbox {sandbox_id} is not running on this host") from None

    @staticmethod
    def call_context(row: Sandbox, env: Mapping[str, str] | None,
                     cwd: str | None) -> tuple[dict[str, str] | None, str | None, str | None]:
        """(env, cwd, user) of a command a request runs in the sandbox: the request's env
        over the sandbox's (its template's ENV and the create's env), the request's cwd or the
        template's WORKDIR, and the template's USER."""
        merged = {**(row.env or {}), **(env or {})}
        return merged or None, cwd or row.cwd, row.user

    def is_busy(self, sandbox_id: str) -> bool:
        return self._busy.get(sandbox_id, 0) > 0

    @asynccontextmanager
    async def busy(self, sandbox_id: str) -> AsyncIterator[None]:
        """Marks a long operation in flight: the idle reaper leaves the sandbox alone."""
        self._busy[sandbox_id] = self._busy.get(sandbox_id, 0) + 1
        try:
            yield
        finally:
            # a kill in the meantime dropped the count (end()): what is left is not ours
            left = self._busy.get(sandbox_id, 0) - 1
            if left > 0:
                self._busy[sandbox_id] = left
            else:
                self._busy.pop(sandbox_id, None)
            with suppress(Exception):
                self.activity.touch(sandbox_id)

    def in_transition(self, sandbox_id: str) -> bool:
        return self._transitions.get(sandbox_id, 0) > 0

    @asynccontextmanager
    async def transition(self, sandbox_id: str) -> AsyncIterator[None]:
        """Marks a state change in flight (pause, snapshot, hibernate, wake...): the sweep
        neither fails the sandbox for a VM process that is briefly gone nor hibernates it."""
        self._transitions[sandbox_id] = self._transitions.get(sandbox_id, 0) + 1
        try:
            async with self.busy(sandbox_id):
                yield
        finally:
            left = self._transitions[sandbox_id] - 1
            if left:
                self._transitions[sandbox_id] = left
            else:
                del self._transitions[sandbox_id]

    async def host_call(self, op: Awaitable[T]) -> T:
        """Await a host operation; what it raises becomes its API error (`api_error_of`:
        the host's SandboxNotFound is 409, not on this host)."""
        return await host_call(op)

    async def sync_state(self, row: Sandbox) -> Sandbox:
        """Make the row's state the runtime's (running, paused or hibernated)."""
        try:
            state = (await self.runtime.get(row.id)).state
        except (SandboxNotFound, HostUnavailable):
            return row
        if state == row.state or state not in AWAKE_STATES:
            return row
        updated = self.store.set_live_state(row.id, state)
        return updated if updated is not None else row

    # -- pause, resume, hibernate, wake ---------------------------------------------------

    @timed("wake", when=lambda _self, row: row.state == "hibernated")
    async def wake_row(self, row: Sandbox) -> Sandbox:
        if row.state == "stopped":
            return await self.restart_row(row)
        # A woken sandbox counts against the quota again, from the check on: a racing wake
        # of another of the team's sandboxes sees it (the hold) before its VM runs.
        admitted: AbstractContextManager[None] = nullcontext()
        if row.state == "hibernated":
            admitted = self.store.holding(row, HOLD_AWAKE,
                                          self.quotas.admission([(row.vcpus, row.memory_mb)]),
                                          ("hibernated",))
        with admitted:
            async with self.transition(row.id):
                await self.host_call(self.runtime.wake(row.id))
                return await self.sync_state(row)

    async def awake(self, team: str, sandbox_id: str) -> Sandbox:
        """The team's live sandbox with a VM (running or paused); woken if hibernated,
        started again if stopped."""
        row = self.live(team, sandbox_id)
        return await self.wake_row(row) if row.state in ("hibernated", "stopped") else row

    async def pause(self, team: str, sandbox_id: str) -> Sandbox:
        row = await self.awake(team, sandbox_id)
        async with self.transition(row.id):
            await self.host_call(self.runtime.pause(row.id))
            return await self.sync_state(row)

    async def resume(self, team: str, sandbox_id: str) -> Sandbox:
        row = await self.awake(team, sandbox_id)
        async with self.transition(row.id):
            await self.host_call(self.runtime.resume(row.id))
            return await self.sync_state(row)

    async def hibernate(self, team: str, sandbox_id: str) -> Sandbox:
        """Idempotent: a hibernated sandbox stays as it is. A stopped one has no VM to save:
        409 (wake it first)."""
        row = self.live(team, sandbox_id)
        if row.state == "stopped":
            raise conflict(f"sandbox {sandbox_id} is stopped (its VM ended: "
                           f"{row.stop_reason}); wake it first")
        return row if row.state == "hibernated" else await self.hibernate_row(row)

    async def hibernate_row(self, row: Sandbox, quota: bool = True) -> Sandbox:
        """`quota`: admit it under the team's max_hibernated first (429 past it); the
        server's own hibernations at a stop pass False."""
        admitted: AbstractContextManager[None] = nullcontext()
        if quota:
            admitted = self.store.holding(row, HOLD_HIBERNATED, self.quotas.hibernation(),
                                          ("running", "paused"))
        with admitted:
            async with self.transition(row.id):
                await self.host_call(self.runtime.hibernate(row.id))
                return await self.sync_state(row)

    async def wake(self, team: str, sandbox_id: str) -> Sandbox:
        """Idempotent: a sandbox that is awake (running or paused) stays as it is. One whose
        host was lost is restored on a live host from what it saved last (`restore_lost`)."""
        row = self.row(team, sandbox_id)
        if row.state == "host_lost":
            return await self.restore_lost(row)
        return await self.wake_row(self.live(team, sandbox_id))

    def stop_row(self, row: Sandbox, reason: str) -> Sandbox:
        """A persistent sandbox whose VM died: `stopped` (`stopped.py`, ADR 0037)."""
        return stop_row(self, row, reason)

    async def restart_row(self, row: Sandbox) -> Sandbox:
        """A stopped sandbox running again under its id (`stopped.py`)."""
        return await restart_row(self, row)

    async def restore_lost(self, row: Sandbox) -> Sandbox:
        """A sandbox of a lost host, back on a live one under its id: from its hibernation
        in the object store, else from its newest snapshot (the state at that snapshot).
        409 host_lost if it saved neither."""
        cluster = self.cluster
        if cluster is None:
            raise lost(row)
        mounted = self.store.sandbox_attachments([row.id]).get(row.id, [])
        if mounted:
            # Its guest has them mounted, and they live on the lost host: restored elsewhere
            # it would write to disks it does not have. The volumes come back with the host.
            raise lost(row, "its volumes (" + ", ".join(v.name for _, v in mounted) +
                       ") are on that host; kill the sandbox, or wait for the host to return")
        with self.store.holding(row, HOLD_AWAKE,
                                self.quotas.admission([(row.vcpus, row.memory_mb)]),
                                ("host_lost",)):
            return await self._restore_lost(cluster, row)

    async def _restore_lost(self, cluster: ClusterPool, row: Sandbox) -> Sandbox:
        async with self.transition(row.id):
            try:
                host_id = await cluster.wake_elsewhere(row.id, vcpus=row.vcpus,
                                                       memory_mb=row.memory_mb)
            except SandboxNotFound:
                snap = self.store.newest_snapshot_of(row.id)
                if snap is None:
                    raise lost(row, "it saved no hibernation or snapshot") from None
                await self.host_call(self.runtime.create(
                    snap.template, vcpus=snap.vcpus, memory_mb=snap.memory_mb,
                    sandbox_id=row.id, snapshot=snap.id))
                host_id = cluster.host_of(row.id)
            except HostError as exc:
                api = api_error_of(exc)
                raise (api or exc) from None
            updated = self.store.update_sandbox(row.id, state="running", host_id=host_id,
                                                last_activity_at=time.time())
            assert updated is not None
            log.info("sandbox %s of lost host %s restored on %s", row.id, row.host_id, host_id)
            return updated

    def host_of(self, sandbox_id: str) -> str | None:
        """The host the sandbox runs on where this server drives many (else None)."""
        if self.cluster is None:
            return None
        try:
            return self.cluster.host_of(sandbox_id)
        except HostError:
            return None

    def mark_lost_hosts(self) -> list[str]:
        """Rows whose host the registry has lost become host_lost; returns their ids."""
        if self.cluster is None:
            return []
        lost_hosts = self.cluster.lost_hosts()
        return self.store.mark_host_lost(lost_hosts) if lost_hosts else []

    # -- create and end -------------------------------------------------------------------

    def _shape(self, team: str, req: CreateSandbox) -> tuple[str, int, int, int | None]:
        """(template, vcpus, memory_mb, disk_mb) of a new sandbox; from a snapshot, the first
        three are the snapshot's (422 if the request names other values)."""
        if req.snapshot is None:
            return req.template or DEFAULT_TEMPLATE, req.vcpus, req.memory_mb, req.disk_mb
        snap = (self.store.get_snapshot(team, req.snapshot)
                if SNAPSHOT_ID_RE.match(req.snapshot) else None)
        if snap is None:
            raise not_found(f"snapshot {req.snapshot!r}")
        clash = [name for name in SNAPSHOT_SHAPE if name in req.model_fields_set
                 and getattr(req, name) is not None
                 and getattr(req, name) != getattr(snap, name)]
        if clash:
            raise ApiError(422, "validation_error",
                           f"{', '.join(clash)}: a sandbox created from a snapshot has the "
                           f"snapshot's {', '.join(SNAPSHOT_SHAPE)}; leave them out")
        return snap.template, snap.vcpus, snap.memory_mb, req.disk_mb or snap.disk_mb

    async def _team_template(self, team: str, req: CreateSandbox) -> TemplateVersion | None:
        """The ready version of the team template the request names, if it names one; its
        shape is the template's (422 if the request names other values)."""
        if req.snapshot is not None or self.templates is None:
            return None
        version = await self.templates.resolve(team, req.template or DEFAULT_TEMPLATE)
        if version is None:
            return None
        shape = {"vcpus": version.vcpus, "memory_mb": version.memory_mb}
        clash = [name for name, value in shape.items() if name in req.model_fields_set
                 and value is not None and getattr(req, name) != value]
        if clash:
            raise ApiError(422, "validation_error",
                           f"{', '.join(clash)}: a sandbox created from template "
                           f"{version.name}:{version.version} has the template's vcpus and "
                           "memory_mb; leave them out")
        return version

    async def _prepared(self, template: str, vcpus: int, memory_mb: int) -> None:
        """Return once built-in `template` is ready for this shape. Its first use builds it
        (minutes under TCG): then answer at once with 409 template_building (Retry-After)
        while the build goes on in the background, instead of holding the request open."""
        key = (template, vcpus, memory_mb)
        task = self._preparing.get(key)
        if task is None:
            task = asyncio.create_task(self.runtime.prepare_template(
                template, vcpus=vcpus, memory_mb=memory_mb), name=f"prepare-{template}")
            self._preparing[key] = task
        if not task.done():
            await asyncio.wait([task], timeout=PREPARE_WAIT_SECONDS)
        if not task.done():
            raise ApiError(409, "template_building",
                           f"template {template!r} is being built for its first use "
                           "(minutes on a fresh host); retry shortly",
                           headers={"Retry-After": str(PREPARE_RETRY_AFTER_SECONDS)})
        exc = task.exception()
        if exc is not None:
            del self._preparing[key]  # the next create tries again
            if isinstance(exc, TemplateNotFound):
                raise not_found(f"template {template!r}")
            if isinstance(exc, HostError | ValueError | OSError):
                raise api_error_of(exc) or ApiError(503, "unavailable", str(exc))
            raise ApiError(503, "unavailable", f"template {template!r} could not be built: "
                           f"{type(exc).__name__}: {exc}")

    @timed("create")
    async def create(self, team: str, req: CreateSandbox) -> Sandbox:
        if pinned_host.get() is not None and self.cluster is None:
            raise ApiError(422, "validation_error", "host_id: this server drives one host "
                           "(there is no host to choose)")
        team_template = await self._team_template(team, req)
        # The lookups run in a worker thread (one waiting on the database's lock must not stall
        # every other request); the writes below stay inline: a create cancelled while one
        # ran in a thread would leave its row `starting`, or its VM without a row update.
        # Without a snapshot the shape is the request's: no lookup, no thread hop.
        template, vcpus, memory_mb, disk_mb = (
            self._shape(team, req) if req.snapshot is None
            else await asyncio.to_thread(self._shape, team, req))
        if team_template is None and req.snapshot is None:
            self.quotas.check_shape(vcpus, memory_mb)  # before a new shape bakes a template
            await self._prepared(template, vcpus, memory_mb)
        snapshot_id, env, cwd, user = req.snapshot, dict(req.env), None, None
        if team_template is not None:
            template = f"{team_template.name}:{team_template.version}"
            vcpus = team_template.vcpus or vcpus
            memory_mb = team_template.memory_mb or memory_mb
            snapshot_id = team_template.snapshot_id
            env = {**(team_template.env or {}), **env}
            cwd, user = team_template.cwd, team_template.user
        policy = None if req.network is None else await self.network_policy(req.network)
        now = time.time()
        row = Sandbox(
            id=new_sandbox_id(), team=team, template=template, state="starting",
            created_at=now, expires_at=now + req.ttl_seconds, ttl_seconds=req.ttl_seconds,
            persistent=req.persistent, vcpus=vcpus, memory_mb=memory_mb,
            disk_mb=disk_mb, env=env, meta=dict(req.metadata),
            last_activity_at=now, ended_at=None, end_reason=None, snapshot=req.snapshot,
            cwd=cwd, user=user, name=req.name,
        )
        volumes = (await asyncio.to_thread(self.volumes.plan_create, team, req, row.id)
                   if req.volumes or req.snapshot else CreatePlan())
        # The quota's check, the volumes' attachments and the `starting` row commit together
        # under the team's lock.
        check = self.quotas.admission([(vcpus, memory_mb)])
        self.volumes.admit([row], check if req.name is None else claiming(check, req.name),
                           [(row.id, volumes.attach)])
        # Without volumes the host's create is called as it always was.
        create = (functools.partial(self.runtime.create, volumes=volumes.mounts)
                  if volumes.mounts else self.runtime.create)
        try:
            with self.volumes.pinned(volumes.host_id):
                await create(template, vcpus=vcpus, memory_mb=memory_mb,
                             disk_mb=req.disk_mb, sandbox_id=row.id,
                             snapshot=snapshot_id, network=policy)
        except BaseException as exc:
            self.store.end_sandbox(row.id, "failed", f"create failed: {exc}"[:2000])
            if isinstance(exc, TemplateNotFound):
                raise not_found(f"template {template!r}") from None
            api = api_error_of(exc) if isinstance(exc, Exception) else None
            if api is None:
                raise
            raise api from None
        ready = time.time()
        host_id = self.host_of(row.id)
        updated = self.store.start_sandbox(row.id, created_at=ready,
                                           expires_at=ready + req.ttl_seconds,
                                           last_activity_at=ready, host_id=host_id)
        if updated is None:  # deleted while it was starting
            with suppress(SandboxNotFound):
                await self.runtime.kill(row.id)
            raise conflict(f"sandbox {row.id} was ended while it was starting")
        self.volumes.place_clones(volumes, host_id)
        # The row carries this activity time: a call right after the create need not write it.
        self.activity.written(row.id, ready)
        return updated

    async def end(self, sandbox_id: str, state: str, reason: str, *,
                  current: str | None = None) -> Sandbox | None:
        """Mark the row ended first (so no new request uses it), then remove the VM.
        `current`: the state the caller just read the row in (saves the store a read)."""
        row = self.store.end_sandbox(sandbox_id, state, reason, current=current)
        try:
            await self.runtime.kill(sandbox_id)
        except SandboxNotFound:
            pass
        except HostUnavailable as exc:
            log.warning("sandbox %s ended but its host is out of reach (%s): its VM is "
                        "killed once the host is back", sandbox_id, exc)
            self.unkilled.add(sandbox_id)
        except HostError:
            log.exception("killing sandbox %s failed", sandbox_id)
        self._busy.pop(sandbox_id, None)
        self.activity.forget(sandbox_id)
        return row

    async def retry_kills(self) -> list[str]:
        """Kill the VMs of sandboxes that ended while their host was out of reach; returns
        those the host has confirmed gone (stops at the first host still out of reach)."""
        done: list[str] = []
        for sandbox_id in sorted(self.unkilled):
            try:
                await self.runtime.kill(sandbox_id)
            except SandboxNotFound:
                pass
            except HostUnavailable:
                break
            except HostError:
                log.exception("killing sandbox %s failed", sandbox_id)
            self.unkilled.discard(sandbox_id)
            done.append(sandbox_id)
        return done

    async def delete(self, team: str, sandbox_id: str) -> None:
        """Kill; idempotent on a sandbox that already ended (its row is left unchanged)."""
        row = self.row(team, sandbox_id, touch=False)
        if row.state not in ENDED_STATES:
            await self.end(row.id, "killed", "killed by API request", current=row.state)

    def set_lifecycle(self, team: str, sandbox_id: str, ttl_seconds: int | None,
                      persistent: bool | None, timeout_seconds: int | None = None) -> Sandbox:
        """`ttl_seconds` counts from creation; `timeout_seconds` from now (E2B's
        set_timeout), kept as the TTL that ends at the same instant, so `expires_at =
        created_at + ttl_seconds` stays true of every row."""
        row = self.row(team, sandbox_id)
        if row.state in ENDED_STATES:
            raise conflict(f"sandbox {sandbox_id} is {row.state}, not running")
        if ttl_seconds is not None and timeout_seconds is not None:
            raise bad_request("give ttl_seconds (from creation) or timeout_seconds (from "
                              "now), not both")
        values: dict[str, object] = {}
        if timeout_seconds is not None:
            ttl_seconds = max(1, math.ceil(time.time() + timeout_seconds - row.created_at))
        if ttl_seconds is not None:
            values["ttl_seconds"] = ttl_seconds
            values["expires_at"] = row.created_at + ttl_seconds
        if persistent is not None:
            values["persistent"] = persistent
        updated = self.store.update_sandbox(row.id, **values) if values else row
        assert updated is not None
        return updated

    # -- network --------------------------------------------------------------------------

    async def network_policy(self, spec: NetworkSpec) -> NetworkPolicy:
        """The runtime's policy for `spec`, or 422 (malformed entries, and allow_out CIDRs
        reaching into the always-denied ranges outside the operator's list, are refused
        before anything changes; names are judged per connection by the host's egress
        proxy, which never connects to those ranges either)."""
        try:
            policy = NetworkPolicy.from_dict(spec.model_dump())
            policy.check_allow_out(self.settings.network_operator_allow)
        except ValueError as exc:
            raise ApiError(422, "validation_error", str(exc)) from None
        return policy

    async def placement(self, sandbox_id: str) -> SandboxPlacement:
        """Where the sandbox's network is on its host (409 if it is not on this host)."""
        return await self.host_call(self.runtime.placement(sandbox_id))

    async def network(self, team: str, sandbox_id: str) -> NetworkSpec:
        """The egress policy of the team's live sandbox (any live state: no wake needed)."""
        row = self.live(team, sandbox_id)
        return to_network_spec((await self.placement(row.id)).network)

    async def update_network(self, team: str, sandbox_id: str, spec: NetworkSpec, *,
                             merge: bool) -> NetworkSpec:
        """Replace the policy (`merge`: only the fields the request set change)."""
        row = self.live(team, sandbox_id)
        if merge:
            current = to_network_spec((await self.placement(row.id)).network)
            spec = current.model_copy(update={name: getattr(spec, name)
                                              for name in spec.model_fields_set})
        policy = await self.network_policy(spec)
        applied = await self.host_call(self.runtime.update_network(row.id, policy))
        return to_network_spec(applied)

    # -- startup --------------------------------------------------------------------------

    async def reconcile(self) -> tuple[list[str], list[str]]:
        """After `runtime.start()`: the rows and the host's VMs and snapshots made to agree
        (stopped.reconcile says how); returns the ids of the rows failed and of the VMs killed."""
        return await reconcile(self)

    async def _reconcile_snapshots(self) -> None:
        await reconcile_snapshots(self)
