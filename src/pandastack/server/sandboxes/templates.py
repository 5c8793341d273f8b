"""Team templates at the API level: builds run in the background (inside microVMs, through the
host port's `build_template`), their log lines are kept for followers, and each build becomes a new
version of the team's template name. A create names a template as `name` (its newest ready
version) or `name:version`; built-in names (base, python, node, code-interpreter) stay built-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pandastack.hostport.errors import BuildFailed, HostError, ImageError, SnapshotNotFound
from pandastack.hostport.registries import RegistryLogin
from pandastack.rules import BUILD_ID_RE, BUILTIN_TEMPLATE_NAMES, TEMPLATE_NAME_BODY, new_build_id
from pandastack.templatespec import CopyStep, TemplateSpec
from pandastack.templatespec.base import names_an_image
from pandastack.templatespec.ports import merged_ports
from pandastack.templatespec.registry_host import image_registry
from pandastack.wire.resources import BuildTemplate, TemplateBuildInfo

from ..registries.service import RegistryCredentialService
from ..store import TemplateVersion
from ..web.errors import ApiError, conflict, from_host_error, not_found
from .service import SandboxService
from .snapshots import snapshot_row

log = logging.getLogger("pandastack.server")
T = TypeVar("T")

SNAPSHOT_PREFIX = "snapshot:"
TEMPLATE_REF_RE = re.compile(rf"^(?P<name>{TEMPLATE_NAME_BODY})(?::(?P<version>[0-9]{{1,9}}))?$")
#: Log lines kept per build (in memory while it runs, in the store after).
MAX_LOG_LINES = 5000
#: In a cluster, a build still `building` this long after it began is taken for one whose API
#: server died (nothing records which server runs a build yet, so a younger one may be
#: another server's, under way).
BUILD_DEADLINE_SECONDS = 6 * 3600.0
MAX_LOG_LINE = 4000
#: What a build reserves of its team's max_template_gb before its size is known, beyond its
#: COPY files and the compressed layers of the images it starts from: about what a small
#: template keeps (its snapshot's memory state and disk layers; a one-step build FROM base
#: at 512 MiB stored 84.8 MiB). Settled at the build's end.
BUILD_RESERVE_BYTES = 128 << 20


@dataclass
class BuildLog:
    """The lines of one build so far; followers wait on `changed` for more."""

    lines: list[str] = field(default_factory=list)
    dropped: int = 0
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, line: str) -> None:
        self.lines.append(line[:MAX_LOG_LINE])
        if len(self.lines) > MAX_LOG_LINES:  # keep the newest; the head is rarely the news
            del self.lines[0]
            self.dropped += 1
        self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


def copied_bytes(spec: TemplateSpec) -> int:
    """The bytes of the build's COPY files (every stage's)."""
    steps = [*(step for stage in spec.stages for step in stage.steps), *spec.steps]
    return sum(f.size for step in steps if isinstance(step, CopyStep) for f in step.files)


def stored_spec(spec: TemplateSpec) -> dict[str, Any]:
    """The spec as kept after the build: each COPY file's body (base64, up to 64 MiB in all)
    becomes its size and SHA-256. Nothing reads a stored spec back to build again; it tells
    an operator what a version was built from, and the digests say which files went in."""
    steps: list[dict[str, Any]] = []
    for step in spec.steps:
        if isinstance(step, CopyStep):
            steps.append({"kind": step.kind, "dst": step.dst, "files": [
                {"path": f.path, "mode": f.mode, "size": f.size,
                 "sha256": hashlib.sha256(f.content()).hexdigest()} for f in step.files]})
        else:
            steps.append(step.model_dump(mode="json"))
    return {**spec.model_dump(mode="json", exclude={"steps"}), "steps": steps}


def to_build_info(row: TemplateVersion) -> TemplateBuildInfo:
    status = row.status if row.status in ("building", "ready", "failed") else "failed"
    return TemplateBuildInfo(
        build_id=row.id, name=row.name, version=row.version, status=status,  # type: ignore[arg-type]
        created_at=row.created_at, finished_at=row.finished_at, error=row.error,
        steps_total=row.steps_total, steps_cached=row.steps_cached,
        exposed_ports=list(row.exposed_ports or ()))


class TemplateService:
    def __init__(self, sandboxes: SandboxService, *, cache_entries: int = 32,
                 max_concurrent: int = 2, max_per_team: int = 1,
                 registries: RegistryCredentialService | None = None) -> None:
        self.sandboxes = sandboxes
        self.registries = registries
        self.cache_entries = cache_entries
        # Each build is a VM doing heavy work: more at once only slows them all down.
        self._slots = asyncio.Semaphore(max_concurrent)
        # A team's builds beyond `max_per_team` wait for its own, not for the shared slots:
        # one team starting many builds (or one that runs for hours) cannot hold them all.
        self.max_per_team = max_per_team
        self._team_slots: dict[str, asyncio.Semaphore] = {}
        self._team_waiting: dict[str, int] = {}
        self.store = sandboxes.store
        self.runtime = sandboxes.runtime
        self._logs: dict[str, BuildLog] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- builds ---------------------------------------------------------------------------
    # Store calls from requests and builds run in a worker thread (`asyncio.to_thread`): a
    # query waiting on SQLite's lock (up to its 30 s timeout) must not stall every request.

    async def start_build(self, team: str, req: BuildTemplate) -> TemplateVersion:
        if req.name in BUILTIN_TEMPLATE_NAMES:
            raise ApiError(422, "validation_error",
                           f"{req.name!r} is a built-in template name; choose another")
        self.sandboxes.quotas.check_shape(req.vcpus, req.memory_mb)
        row = TemplateVersion(
            id=new_build_id(), team=team, name=req.name, version=0,
            status="building", env={}, vcpus=req.vcpus, memory_mb=req.memory_mb,
            created_at=time.time())
        stages = [stage.model_copy(update={"from_template": await self._base(
            team, stage.from_template)}) for stage in req.spec.stages]
        spec = req.spec.model_copy(update={
            "from_template": await self._base(team, req.spec.from_template), "stages": stages})
        logins = await self._logins(team, spec)
        row.size_bytes = BUILD_RESERVE_BYTES + copied_bytes(spec) + await self._check_images(
            spec, logins)
        return await self._uncancellable(self._begin(row, req, spec, logins),
                                         f"begin-{row.id}")

    async def _logins(self, team: str, spec: TemplateSpec) -> dict[str, RegistryLogin]:
        """The team's credentials for the registries the build's images come from (no
        others: a build carries only what its pulls use)."""
        bases = [spec.from_template, *(stage.from_template for stage in spec.stages)]
        wanted = {image_registry(base) for base in bases if names_an_image(base)}
        if self.registries is None or not wanted:
            return {}
        return await self.registries.logins_for(team, wanted)

    async def _check_images(self, spec: TemplateSpec,
                            logins: dict[str, RegistryLogin]) -> int:
        """Each image the build starts from, asked of its registry now with the team's
        login there, as the build's pull will (within the host's inspect deadline, 20 s):
        a missing image or tag is this request's 404, a refused login its 403, a registry
        that does not answer its 502, an image over the bounds its 413, each naming the
        image (docs/templates.md), not a build that fails later. The build's pull asks
        again (the tag may move meanwhile). A host that cannot be asked (out of reach, or
        an agent from before this call) leaves the answer to the build. Returns the images'
        compressed bytes (part of the build's reservation)."""
        bases = [spec.from_template, *(stage.from_template for stage in spec.stages)]
        size = 0
        for image in sorted({base for base in bases if names_an_image(base)}):
            try:
                size += (await self.runtime.inspect_image(image, registry_logins=logins)).size
            except ImageError as exc:
                raise from_host_error(exc) from None
            except HostError as exc:
                log.warning("image %s was not looked up before its build: %s", image, exc)
        return size

    async def _begin(self, row: TemplateVersion, req: BuildTemplate, spec: TemplateSpec,
                     logins: dict[str, RegistryLogin]) -> TemplateVersion:
        row = await asyncio.to_thread(self._add_version, row, req.spec)
        build_log = self._logs[row.id] = BuildLog()
        self._track(asyncio.create_task(self._run(row, req, spec, build_log, logins),
                                        name=f"build-{row.id}"))
        return row

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _uncancellable(self, work: Coroutine[Any, Any, T], name: str) -> T:
        """Await `work` to its end even if the request is cancelled meanwhile: a row
        inserted in a worker thread must get its build task, a deleted version its snapshot
        removed (only `close` stops it)."""
        task = asyncio.create_task(work, name=name)
        self._track(task)
        return await asyncio.shield(task)

    def _add_version(self, row: TemplateVersion, spec: TemplateSpec) -> TemplateVersion:
        return self.store.add_template_version(
            row, stored_spec(spec), check=self.sandboxes.quotas.template_room(row.size_bytes))

    async def _base(self, team: str, base: str) -> str:
        """The host's name for the base the team's build starts from, resolved through the
        team: `snapshot:<id>` must be one of the team's snapshots, any other bare name not
        built in must be one of its ready templates (404 otherwise, the same answer as for an
        unknown id); a name with a tag, digest, path or host is an image, pulled by the host
        (templatespec/base.py). The host's catalogue also holds other teams' snapshots and
        internal ones (step cache, template results): an id from the request never reaches
        it unchecked. Every stage's base of a multi-stage build is resolved so."""
        if base.startswith(SNAPSHOT_PREFIX):
            snap = await asyncio.to_thread(snapshot_row, self.sandboxes, team,
                                           base.removeprefix(SNAPSHOT_PREFIX))
            return SNAPSHOT_PREFIX + snap.id
        if base in BUILTIN_TEMPLATE_NAMES:
            return base
        if names_an_image(base):  # a tag, digest, path or host: never one of ours
            return base
        version = await self.resolve(team, base)
        if version is None or not version.snapshot_id:
            raise not_found(f"template {base!r}")
        return SNAPSHOT_PREFIX + version.snapshot_id

    @contextlib.asynccontextmanager
    async def _build_slot(self, team: str, build_log: BuildLog) -> AsyncIterator[None]:
        """One of the team's own build slots, then one of the shared ones."""
        own = self._team_slots.get(team)
        if own is None:
            own = self._team_slots[team] = asyncio.Semaphore(self.max_per_team)
        self._team_waiting[team] = self._team_waiting.get(team, 0) + 1
        try:
            if own.locked():
                build_log.add(f"waiting for this team's other builds ({self.max_per_team} "
                              "at a time per team)")
            async with own:
                if self._slots.locked():
                    build_log.add("waiting for a build slot (other builds are running)")
                async with self._slots:
                    yield
        finally:
            self._team_waiting[team] -= 1
            if not self._team_waiting[team]:  # no build of the team left: nor its semaphore
                del self._team_waiting[team]
                del self._team_slots[team]

    async def _run(self, row: TemplateVersion, req: BuildTemplate, spec: TemplateSpec,
                   build_log: BuildLog, logins: dict[str, RegistryLogin]) -> None:
        build_log.add(f"build {row.id}: template {row.name} version {row.version}")
        values: dict[str, object]
        try:
            policy = None
            if req.network is not None:
                policy = await self.sandboxes.network_policy(req.network)
            async with self._build_slot(row.team, build_log):
                # The step cache is per team: an equal prefix of another team's steps holds
                # what that team's build made (keys, secrets), and a hit would tell of it.
                result = await self.runtime.build_template(
                    spec, log=build_log.add, network=policy, vcpus=req.vcpus,
                    memory_mb=req.memory_mb, cache_scope=row.team, registry_logins=logins)
        except asyncio.CancelledError:
            values = {"status": "failed", "error": "the server stopped during the build",
                      "size_bytes": 0}
            raise
        except (BuildFailed, HostError, ApiError, ValueError) as exc:
            message = exc.message if isinstance(exc, ApiError) else str(exc)
            build_log.add(f"build failed: {message}")
            values = {"status": "failed", "error": message[:8000], "size_bytes": 0}
        except Exception as exc:
            log.exception("template build %s failed", row.id)
            build_log.add(f"build failed: internal error ({type(exc).__name__})")
            values = {"status": "failed", "error": f"internal error ({type(exc).__name__})",
                      "size_bytes": 0}
        else:
            # The image's (the host read its config) and the Dockerfile's EXPOSE, as Docker
            # merges a base image's with its own.
            ports = merged_ports(result.exposed_ports, spec.exposed_ports)
            if spec.exposed_ports:
                build_log.add(f"exposes {', '.join(ports)}")
            build_log.add(f"ready: {result.steps_total} steps ({result.steps_cached} cached) "
                          f"in {result.seconds:.1f}s")
            values = {"status": "ready", "snapshot_id": result.snapshot_id,
                      "env": dict(result.env), "cwd": result.workdir, "user": result.user,
                      "steps_total": result.steps_total, "steps_cached": result.steps_cached,
                      "exposed_ports": ports or None, "size_bytes": result.size_bytes}
        finally:
            try:  # stored before followers are told the build ended: they read its status
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._finish, row.id, build_log.lines,
                                            {**values, "finished_at": time.time()})
            finally:
                build_log.finish()
                self._logs.pop(row.id, None)
            with contextlib.suppress(Exception):
                await self.prune_cache()

    def _finish(self, build_id: str, lines: list[str], values: dict[str, Any]) -> None:
        self.store.finish_template_build(build_id, "\n".join(lines), values)

    async def prune_cache(self) -> None:
        """Keep the `cache_entries` most recently used step-cache entries (each holds a
        snapshot: ~100+ MB of memory state); the rest and their snapshots go."""
        await self.runtime.prune_build_cache(self.cache_entries)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def build_row(self, team: str, build_id: str) -> TemplateVersion:
        row = (await asyncio.to_thread(self.store.get_template_build, team, build_id)
               if BUILD_ID_RE.match(build_id) else None)
        if row is None:
            raise not_found(f"template build {build_id!r}")
        return row

    async def follow_logs(self, team: str, build_id: str) -> AsyncIterator[str]:
        """Every log line of the build, then (while it runs) each new one until it ends."""
        row = await self.build_row(team, build_id)
        build_log = self._logs.get(row.id)
        if build_log is None:  # finished (or from before a restart): the stored lines
            logs = await asyncio.to_thread(self.store.template_build_logs, team, row.id)
            for line in (logs or "").splitlines():
                yield line
            return
        sent = 0  # index into the lines, adjusted when old lines are dropped
        seen_dropped = build_log.dropped
        while True:
            waiter = build_log.changed
            sent = max(0, sent - (build_log.dropped - seen_dropped))
            seen_dropped = build_log.dropped
            while sent < len(build_log.lines):
                yield build_log.lines[sent]
                sent += 1
            if build_log.done:
                return
            await waiter.wait()

    # -- names and versions ---------------------------------------------------------------

    async def versions(self, team: str, name: str) -> list[TemplateVersion]:
        rows = await asyncio.to_thread(self.store.template_versions, team, name)
        if not rows:
            raise not_found(f"template {name!r}")
        return rows

    async def newest(self, team: str) -> list[TemplateVersion]:
        """The newest version of each of the team's templates, by name."""
        return await asyncio.to_thread(self.store.newest_template_versions, team)

    async def resolve(self, team: str, ref: str) -> TemplateVersion | None:
        """The ready version a create names (None: not a team template, maybe a built-in).
        409 when the template exists but has no ready version yet (building or failed)."""
        match = TEMPLATE_REF_RE.match(ref)
        if match is None or (match["version"] is None and ref in BUILTIN_TEMPLATE_NAMES):
            return None
        name, version = match["name"], match["version"]
        return await asyncio.to_thread(
            self._resolve, team, name, None if version is None else int(version))

    def _resolve(self, team: str, name: str, version: int | None) -> TemplateVersion | None:
        if version is not None:
            row = self.store.template_version(team, name, version)
            if row is None:
                raise not_found(f"template {f'{name}:{version}'!r}")
            if row.status != "ready":
                raise _not_ready(row)
            return row
        ready = self.store.template_version(team, name, ready=True)
        if ready is not None:
            return ready
        newest = self.store.template_version(team, name)
        if newest is None:
            return None
        raise _not_ready(newest)

    async def delete(self, team: str, name: str, version: int | None) -> None:
        """Delete one version or all; sandboxes already created from them keep running
        (they hold their own links to the snapshot's layers). A version still building is
        refused (409)."""
        rows = await self.versions(team, name)
        if version is not None:
            rows = [r for r in rows if r.version == version]
            if not rows:
                raise not_found(f"template {name}:{version}")
        if any(r.status == "building" for r in rows):
            raise conflict(f"template {name} has a build in progress; wait for it to end")
        await self._uncancellable(self._delete_rows(rows), f"delete-{name}")

    async def _delete_rows(self, rows: list[TemplateVersion]) -> None:
        await asyncio.to_thread(self._mark_deleted, [row.id for row in rows])
        for row in rows:
            if row.snapshot_id:
                with contextlib.suppress(SnapshotNotFound):
                    await self.runtime.delete_snapshot(row.snapshot_id)

    def _mark_deleted(self, build_ids: list[str]) -> None:
        for build_id in build_ids:
            self.store.delete_template_version(build_id)

    async def reconcile(self) -> None:
        """After a restart: builds that were running failed; ready versions whose snapshot is
        gone from the host are marked failed (they cannot be restored). In a cluster, a build
        may be another API server's, under way (only one older than any build may take
        failed), and snapshots are in the object store, not only on the hosts up now."""
        cluster = self.sandboxes.cluster is not None
        held = (set() if cluster else
                {info.id for info in await self.runtime.list_snapshots(include_internal=True)})
        started_before = time.time() - BUILD_DEADLINE_SECONDS
        for row in self.store.all_template_versions():
            if row.status == "building" and cluster and row.created_at > started_before:
                continue
            if row.status == "ready" and cluster:
                continue
            if row.status == "building":
                self.store.update_template_version(
                    row.id, status="failed", finished_at=time.time(),
                    error="the server restarted during the build")
            elif row.status == "ready" and row.snapshot_id not in held:
                log.warning("template %s:%d of team %s lost its snapshot", row.name,
                            row.version, row.team)
                self.store.update_template_version(
                    row.id, status="failed", error="its snapshot is gone from the host")


def _not_ready(row: TemplateVersion) -> ApiError:
    if row.status == "building":
        return ApiError(409, "template_building",
                        f"template {row.name}:{row.version} is still building "
                        f"(build {row.id}); retry when it is ready",
                        headers={"Retry-After": "5"})
    return conflict(f"template {row.name}:{row.version} failed to build: {row.error}")
