"""Template builds: run a `TemplateSpec`'s steps inside a microVM and save the result as a
snapshot that sandboxes are created from.

    builds = TemplateBuilds(runtime)
    result = await builds.build(spec, log=print, network=NetworkPolicy(internet=False))
    sbx = await runtime.create(snapshot=result.snapshot_id)  # the start command already runs

A build creates a sandbox from the spec's base (a built-in template name, `snapshot:<id>`,
or an OCI image reference: image_base.py), runs each step there (steps are untrusted: nothing
of them runs on the host), starts the start command, waits for its ready check and takes the
final snapshot. The build sandbox is always killed, whatever happens (failure, cancellation).

Step cache: after every step that changed the guest the build takes an internal snapshot and
records it under the step's key (`templatespec.step_key`, chained from a key of the base), so
a later build of the same prefix starts from that snapshot instead of redoing the steps. Each
such snapshot holds the guest's memory (about its used RAM on disk, shared disk layers
aside): `prune_cache` deletes them, e.g. `builds.prune_cache(lambda e: time.time() -
e.last_used_at < 7 * 86400)` keeps a week's worth. The final snapshot is not part of the
cache: it belongs to the caller, who deletes it with `runtime.delete_snapshot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shlex
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.agentlink.client import exit_code_of
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.templates.copy_from import (
    export_stage,
    import_stage,
    stage_sources,
    stage_title,
)
from pandastack.host.templates.image_base import ImageBase, ensure_image_base, is_image
from pandastack.host.templates.step_cache import CacheEntry, StepCache
from pandastack.host.templates.steps import (
    BuildState,
    Log,
    Output,
    ready_probe,
    replay_step,
    run_step,
    user_of,
)
from pandastack.host.vmm.driver import MachineShape
from pandastack.hostport.errors import (
    AgentConnectionError,
    AgentError,
    BuildFailed,
    SandboxNotFound,
    SnapshotNotFound,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.registries import RegistryLogins
from pandastack.hostport.results import BuildResult
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_VCPUS
from pandastack.templatespec import (
    HOST_ONLY_STEPS,
    CopyFromStep,
    StageSpec,
    TemplateSpec,
    describe_step,
    step_key,
)

CACHE_VERSION = "1"  # part of every key: bump when what a step does changes
DEFAULT_STEP_TIMEOUT_S = 20 * 60.0
READY_POLL_S = 0.2
PROBE_TIMEOUT_S = 30.0
SNAPSHOT_PREFIX = "snapshot:"
STAGES_DIR = "stages"  # under the step cache's directory: a build's stage archives


@dataclass(frozen=True)
class _Run:
    """One build's settings, the same for each of its stages."""

    log: Log
    network: NetworkPolicy | None
    timeout: float
    cache: bool
    vcpus: int
    memory_mb: int
    disk_mb: int | None
    scope: str
    logins: RegistryLogins


@dataclass(frozen=True)
class _Chain:
    """A stage (the last one: the spec itself) with its base and its steps' cache keys."""

    spec: TemplateSpec
    image: ImageBase | None
    root: str
    keys: list[str]

    @property
    def key(self) -> str:
        """The key of the stage's state after its last step."""
        return self.keys[-1] if self.keys else self.root


def _stage_spec(stage: StageSpec) -> TemplateSpec:
    # Not validated again: its copies name stages of the whole spec, which has checked them.
    return TemplateSpec.model_construct(from_template=stage.from_template, steps=stage.steps,
                                        start=None, ready=None, stages=[])


class TemplateBuilds:
    def __init__(self, runtime: HostRuntime, cache_dir: Path | None = None, *,
                 step_timeout: float = DEFAULT_STEP_TIMEOUT_S) -> None:
        self.runtime = runtime
        self.cache = StepCache(cache_dir if cache_dir is not None
                               else runtime.config.builds_dir)
        self.step_timeout = step_timeout
        self.cache.sweep()

    async def build(self, spec: TemplateSpec, *, log: Log,
                    network: NetworkPolicy | None = None, step_timeout: float | None = None,
                    cache: bool = True, vcpus: int = DEFAULT_VCPUS,
                    memory_mb: int = DEFAULT_MEMORY_MB,
                    disk_mb: int | None = None, cache_scope: str = "",
                    registry_logins: RegistryLogins | None = None) -> BuildResult:
        """Build `spec`; raises BuildFailed (naming the failing step, with its output's tail)
        and the runtime's own errors (an unknown base template, a failed create).

        `cache_scope` names whose cache this build reads and fills (the control plane passes
        the team): builds of different scopes never share a cached step, since a cached
        state holds whatever its steps made (generated keys, fetched secrets).
        `registry_logins` (the team's, by registry) pull its images; they stay in memory.

        A multi-stage spec's earlier stages run first, one VM at a time, each only if a step
        still to run copies from it: their copied paths leave their VM as an archive on the
        host (copy_from.py), the VM is removed, and the archives are deleted at the end."""
        started = time.monotonic()
        timeout = step_timeout if step_timeout is not None else self.step_timeout
        if not 0 < timeout <= 24 * 3600:
            raise ValueError("step_timeout must be between 0 and 24 hours")
        run = _Run(log=log, network=network, timeout=timeout, cache=cache, vcpus=vcpus,
                   memory_mb=memory_mb, disk_mb=disk_mb, scope=cache_scope,
                   logins=registry_logins or {})
        chains: list[_Chain] = []
        for stage in spec.stages:
            chains.append(await self._chain(_stage_spec(stage), run, chains))
        last = await self._chain(spec, run, chains)
        needed = self._needed_stages(chains, last, cache)
        workdir = self.cache.root / STAGES_DIR / uuid.uuid4().hex
        archives: dict[int, Path] = {}
        try:
            sources = stage_sources(spec)
            for index in sorted(needed):
                title = stage_title(index, spec.stages[index])
                log(f"== {title}: FROM {spec.stages[index].from_template}")
                workdir.mkdir(parents=True, exist_ok=True)
                archive = workdir / f"{index}.tar"
                await self._run_stage(chains[index], run, archives, title=title,
                                      sources=sources[index], archive=archive)
                archives[index] = archive
            if spec.stages:
                log(f"== last stage: FROM {spec.from_template}")
            return await self._run_last(last, run, archives, started)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _chain(self, spec: TemplateSpec, run: _Run, stages: list[_Chain]) -> _Chain:
        """A stage's base made ready and its steps' cache keys; a copy from a stage has that
        stage's last key in its own."""
        image = None
        if is_image(spec.from_template):
            image = await ensure_image_base(self.runtime, spec.from_template,
                                            MachineShape(run.vcpus, run.memory_mb), run.log,
                                            logins=run.logins)
        root = await self._root_key(spec, run.vcpus, run.memory_mb, run.disk_mb, run.scope,
                                    run.network, image)
        keys: list[str] = []
        for step in spec.steps:
            key = step_key(keys[-1] if keys else root, step)
            if isinstance(step, CopyFromStep):
                key = hashlib.sha256(f"{key}\n{stages[step.stage].key}".encode()).hexdigest()
            keys.append(key)
        return _Chain(spec=spec, image=image, root=root, keys=keys)

    def _needed_stages(self, stages: list[_Chain], last: _Chain, cache: bool) -> set[int]:
        """The stages a step still to run copies from (a cached step's copy is in its
        snapshot), and theirs."""

        def refs(chain: _Chain) -> set[int]:
            done = self._cached_prefix(chain.keys)[0] if cache else 0
            return {s.stage for s in chain.spec.steps[done:] if isinstance(s, CopyFromStep)}

        needed = refs(last)
        for index in range(len(stages) - 1, -1, -1):
            if index in needed:
                needed |= refs(stages[index])
        return needed

    async def _run_stage(self, chain: _Chain, run: _Run, archives: dict[int, Path], *,
                         title: str, sources: list[str], archive: Path) -> None:
        sandbox, done, last_snapshot = await self._sandbox(
            chain.spec, chain.keys if run.cache else [], network=run.network, vcpus=run.vcpus,
            memory_mb=run.memory_mb, disk_mb=run.disk_mb, image=chain.image)
        try:
            state = initial_state(chain.image)
            await self._steps(chain, sandbox, done, last_snapshot, state, run, archives)
            size = await export_stage(sandbox, sources, archive, title=title,
                                      timeout=run.timeout)
            run.log(f" ---> {title}: {len(sources)} path{'s' if len(sources) != 1 else ''} "
                    f"handed over ({size} bytes packed)")
        finally:
            # Shielded: a cancelled build still removes the stage's VM (and its disk).
            with contextlib.suppress(Exception):
                await asyncio.shield(self._discard(sandbox))

    async def _run_last(self, chain: _Chain, run: _Run, archives: dict[int, Path],
                        started: float) -> BuildResult:
        spec = chain.spec
        total = len(spec.steps)
        sandbox, done, last_snapshot = await self._sandbox(
            spec, chain.keys if run.cache else [], network=run.network, vcpus=run.vcpus,
            memory_mb=run.memory_mb, disk_mb=run.disk_mb, image=chain.image)
        final: str | None = None
        start = spec.start
        try:
            if chain.image is not None and chain.image.defaults.exposed_ports:
                run.log(f"image {spec.from_template}: exposes "
                        f"{', '.join(chain.image.defaults.exposed_ports)}")
            if spec.start_from_image:
                start = image_start(chain.image, spec.from_template, len(spec.steps))
            state = initial_state(chain.image)
            await self._steps(chain, sandbox, done, last_snapshot, state, run, archives)
            if start is not None:
                await self._start(sandbox, start, spec, state, run.log)
            # Durable (fsynced), unlike the cache's: a template must survive a host crash.
            # Nobody waits on the build sandbox: the fastest save is the best.
            saved = (await self.runtime.snapshot(sandbox.id, short_pause=False)).info
            final = saved.id
            run.log(f"Built {final} in {time.monotonic() - started:.1f}s ({done} of {total} "
                    "steps cached)")
        except BaseException:
            # Shielded: a cancelled build still kills its sandbox. A failing kill must not
            # hide why the build failed.
            self._forget(final)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._discard(sandbox))
            raise
        try:
            await asyncio.shield(self._discard(sandbox))
        except BaseException:
            self._forget(final)
            raise
        return BuildResult(snapshot_id=final, env=dict(state.env), workdir=state.workdir,
                           user=state.user, start=start, steps_total=total,
                           steps_cached=done, seconds=time.monotonic() - started,
                           exposed_ports=chain.image.defaults.exposed_ports
                           if chain.image is not None else (),
                           size_bytes=saved.size_bytes + (chain.image.disk_bytes
                                                          if chain.image is not None else 0))

    async def _steps(self, chain: _Chain, sandbox: SandboxHandle, done: int,
                     last_snapshot: str | None, state: BuildState, run: _Run,
                     archives: dict[int, Path]) -> None:
        """A stage's steps in its sandbox: the first `done` replayed from the cache, each
        other run and (with the cache) saved under its key."""
        spec, log = chain.spec, run.log
        total = len(spec.steps)
        for index, step in enumerate(spec.steps):
            title = describe_step(step)
            header = f"Step {index + 1}/{total} {title}"
            if index < done:
                log(f"{header} (cached)")
                await replay_step(sandbox, step, state)
                continue
            log(header)
            step_started = time.monotonic()
            if isinstance(step, CopyFromStep):
                archive = archives.get(step.stage)
                if archive is None:  # its cached copy was pruned after the build looked
                    raise BuildFailed(f"step {index + 1}/{total} {title}: stage "
                                      f"{step.stage} was not built (the step cache changed "
                                      "during the build); build again",
                                      step=index + 1, instruction=title)
                await import_stage(sandbox, step, archive, state, number=index + 1,
                                   total=total, title=title, timeout=run.timeout,
                                   out=Output(log))
            else:
                await run_step(sandbox, step, state, number=index + 1, total=total,
                               title=title, timeout=run.timeout, log=log)
            ran = time.monotonic() - step_started
            snap_s = 0.0
            if run.cache:
                if not isinstance(step, HOST_ONLY_STEPS):
                    snap_started = time.monotonic()
                    last_snapshot = await self._save_step(sandbox, chain.keys[index], spec)
                    snap_s = time.monotonic() - snap_started
                else:
                    entry = self.cache.put(chain.keys[index], last_snapshot,
                                           spec.from_template)
                    last_snapshot = entry.snapshot_id
            log(f" ---> {ran:.2f}s" + (f" + {snap_s:.2f}s cache snapshot" if snap_s else ""))

    # -- the build sandbox ----------------------------------------------------------------

    async def _root_key(self, spec: TemplateSpec, vcpus: int, memory_mb: int,
                        disk_mb: int | None, scope: str, network: NetworkPolicy | None,
                        image: ImageBase | None) -> str:
        """A key of the base the steps run on: for a built-in template its current version
        (a rebuilt template starts a new chain), for a snapshot its immutable id; with whose
        cache it is and the network the steps had (a step that reached the internet under
        one policy may have made something else under another)."""
        base = spec.from_template
        if base.startswith(SNAPSHOT_PREFIX):
            snapshot_id = base.removeprefix(SNAPSHOT_PREFIX)
            self.runtime.snapshots.get(snapshot_id)  # SnapshotNotFound before any work
            ident = ["snapshot", snapshot_id]
        elif image is not None:  # its template's key names the image's manifest digest
            ident = ["image", base, image.template_key, str(vcpus), str(memory_mb)]
        else:
            template = await self.runtime.ensure_template(base, MachineShape(vcpus, memory_mb))
            ident = ["template", base, template.key, str(vcpus), str(memory_mb)]
        net = json.dumps((network or NetworkPolicy()).to_dict(), sort_keys=True)
        ident += [f"disk={disk_mb}", CACHE_VERSION, f"network={net}",
                  f"scope={json.dumps(scope)}"]
        return hashlib.sha256("|".join(ident).encode()).hexdigest()

    def _cached_prefix(self, keys: list[str]) -> tuple[int, str | None]:
        """How many steps the cache already has, and the snapshot after them (None: the
        base itself). Entries whose snapshot is gone are dropped on the way."""
        for index in range(len(keys) - 1, -1, -1):
            entry = self.cache.get(keys[index])
            if entry is None:
                continue
            if entry.snapshot_id is not None and not self._snapshot_exists(entry.snapshot_id):
                self.cache.drop(entry.key, entry.snapshot_id)
                continue
            self.cache.touch(entry.key)
            return index + 1, entry.snapshot_id
        return 0, None

    def _snapshot_exists(self, snapshot_id: str) -> bool:
        try:
            self.runtime.snapshots.get(snapshot_id)
        except SnapshotNotFound:
            return False
        return True

    async def _sandbox(self, spec: TemplateSpec, keys: list[str], *,
                       network: NetworkPolicy | None, vcpus: int, memory_mb: int,
                       disk_mb: int | None, image: ImageBase | None = None
                       ) -> tuple[SandboxHandle, int, str | None]:
        """The build sandbox, from the longest cached prefix: (sandbox, steps done, the
        snapshot it was made from if a cached one)."""
        while True:
            done, snapshot_id = self._cached_prefix(keys)
            if snapshot_id is None:
                break
            try:
                sandbox = await self.runtime.create(snapshot=snapshot_id, network=network)
            except Exception:
                if self._snapshot_exists(snapshot_id):
                    raise
                continue  # pruned meanwhile: the lookup drops that entry and goes on
            return sandbox, done, snapshot_id
        base = spec.from_template
        if base.startswith(SNAPSHOT_PREFIX):
            sandbox = await self.runtime.create(snapshot=base.removeprefix(SNAPSHOT_PREFIX),
                                                disk_mb=disk_mb, network=network)
        else:
            sandbox = await self.runtime.create(image.template if image else base, vcpus=vcpus,
                                                memory_mb=memory_mb,
                                                disk_mb=disk_mb, network=network)
        return sandbox, done, None

    async def _save_step(self, sandbox: SandboxHandle, key: str, spec: TemplateSpec) -> str:
        snapshot_id = (await self.runtime.snapshot(sandbox.id, internal=True)).info.id
        entry = self.cache.put(key, snapshot_id, spec.from_template)
        if entry.snapshot_id != snapshot_id:  # a concurrent build of the same step was first
            with contextlib.suppress(SnapshotNotFound):
                self.runtime.delete_snapshot(snapshot_id)
        return entry.snapshot_id or snapshot_id

    def _forget(self, snapshot_id: str | None) -> None:
        """Delete the result of a build that did not return it."""
        if snapshot_id is not None:
            with contextlib.suppress(SnapshotNotFound):
                self.runtime.delete_snapshot(snapshot_id)

    async def _discard(self, sandbox: SandboxHandle) -> None:
        with contextlib.suppress(SandboxNotFound):
            await self.runtime.kill(sandbox.id)

    # -- start command and ready check ----------------------------------------------------

    async def _start(self, sandbox: SandboxHandle, start: str, spec: TemplateSpec,
                     state: BuildState,
                     log: Log) -> None:
        title = f"START {start}"
        total = len(spec.steps)
        log(title)
        try:
            pid = await sandbox.spawn(["sh", "-c", start], env=state.env or None,
                                      cwd=state.workdir, user=state.user)
        except AgentError as exc:
            raise BuildFailed(f"start command {start!r} could not start: {exc}",
                              step=total + 1, instruction=title) from exc
        check = spec.ready
        if check is None:
            return
        started = time.monotonic()
        deadline = started + check.timeout_seconds
        probe, probe_user = ready_probe(check, state)
        while True:
            left = deadline - time.monotonic()
            result = await sandbox.exec(probe, timeout=max(1.0, min(left, PROBE_TIMEOUT_S)),
                                        env=state.env or None, cwd=state.workdir,
                                        user=probe_user)
            if result.exit_code == 0 and not result.timed_out:
                log(f" ---> ready ({check.kind} {check.value}) after "
                    f"{time.monotonic() - started:.2f}s")
                return
            # A start command that exits 0 may have left a daemon behind: keep polling it.
            exited = exit_code_of(await sandbox.procs(), pid)
            if exited not in (None, 0) or time.monotonic() >= deadline:
                out = Output(log)
                await _collect(sandbox, pid, out)
                why = (f"exited with code {exited} before it was ready" if exited
                       else f"was not ready ({check.kind} {check.value}) after "
                            f"{check.timeout_seconds:g}s")
                message = f"start command {start!r} {why}"
                if out.tail:
                    message += f"; last output:\n{out.text()}"
                raise BuildFailed(message, step=total + 1, instruction=title,
                                  exit_code=exited, output=out.text())
            await asyncio.sleep(READY_POLL_S)

    # -- cache maintenance ----------------------------------------------------------------

    def cache_entries(self) -> list[CacheEntry]:
        return self.cache.entries()

    def prune_cache(self, keep: Callable[[CacheEntry], bool] | None = None) -> list[str]:
        """Drop every cache entry `keep` does not keep (all without `keep`) and delete the
        snapshots no kept entry names; returns the deleted snapshot ids. A build running
        meanwhile loses at most the reuse of what was pruned."""
        entries = self.cache.entries()
        kept = [e for e in entries if keep is not None and keep(e)
                and (e.snapshot_id is None or self._snapshot_exists(e.snapshot_id))]
        needed = {e.snapshot_id for e in kept}
        kept_keys = {e.key for e in kept}
        deleted: list[str] = []
        for entry in entries:
            if entry.key in kept_keys:
                continue
            self.cache.drop(entry.key, entry.snapshot_id)
            sid = entry.snapshot_id
            if sid is not None and sid not in needed and sid not in deleted:
                with contextlib.suppress(SnapshotNotFound):
                    self.runtime.delete_snapshot(sid)
                    deleted.append(sid)
        return deleted


async def _collect(sandbox: SandboxHandle, pid: int, out: Output) -> None:
    """The start command's output so far (for the error message)."""
    agent = await sandbox.agent()
    with contextlib.suppress(AgentConnectionError):  # still running: what is buffered
        await agent.attach(pid, on_stdout=out.stdout, on_stderr=out.stderr, timeout=2.0)
    out.flush()


def image_start(image: ImageBase | None, base: str, steps: int) -> str:
    """The image's Entrypoint and Cmd as one start command (both exec form in an image
    config, so joined as Docker joins them)."""
    argv = [*image.defaults.entrypoint, *image.defaults.cmd] if image is not None else []
    if not argv:
        raise BuildFailed(f"image {base}: it has no Entrypoint or Cmd to start",
                          step=steps + 1, instruction="START (the image's)")
    return shlex.join(argv)


def initial_state(image: ImageBase | None) -> BuildState:
    """What the first step runs with: an image's Env, WorkingDir and User (its config's
    defaults; ENV, WORKDIR and USER steps override them), else nothing set."""
    if image is None:
        return BuildState()
    defaults = image.defaults
    return BuildState(env=dict(defaults.env), workdir=defaults.working_dir,
                      user=user_of(defaults.user))
