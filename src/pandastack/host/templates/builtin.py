"""Templates: a guest booted once, warmed up, and saved as a snapshot that creates restore.

A template snapshot is specific to the guest image, the driver (VMM version and accelerator)
and the machine shape (vCPUs, memory), so its key hashes all of them. A shape that has no
snapshot yet is baked on first use (one cold boot), then every create with that shape restores.

The built-in templates (`BUILTIN_TEMPLATES`) each name a guest image variant (`images.IMAGES`),
asked of an image provider on first use: a create that needs a template whose image is not built
yet waits for the build, which reports through the progress callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pandastack.host.agentlink import code as code_client
from pandastack.host.agentlink.client import AgentClient, exit_code_of
from pandastack.host.gc import hold_version, prune_images, prune_templates
from pandastack.host.images.build import BASE, KERNEL_SERVER_PATH, GuestImage
from pandastack.host.images.common import fsync_path
from pandastack.host.memory.stage import restaged
from pandastack.host.memory.stage import stage as stage_memory
from pandastack.host.memory.stage import sweep as sweep_staged_memory
from pandastack.host.network.manager import NetworkManager
from pandastack.host.templates import tick
from pandastack.host.vmm.driver import (
    KernelSpec,
    MachineShape,
    SnapshotFiles,
    VMMDriver,
    VMPaths,
    VMProcess,
)
from pandastack.hostport.errors import GuestOSError, HostError, SetupError, TemplateNotFound
from pandastack.hostport.network import NetworkPolicy
from pandastack.rules import E2B_DEFAULT_CWD
from pandastack.templatespec import ReadyCheck

BAKE_VERSION = "4"
BOOT_DEADLINE_S = 240.0
BOOT_RETRY_S = 0.5  # the least time between the starts of two connection attempts at boot
GUEST_KERNEL_ACCELS = ("tcg", "kvm")  # drivers whose VMs run a guest kernel of their own
BAKE_ATTEMPTS = 3  # boots per bake when the guest's tick stays periodic (tick.py)
# Run once before the snapshot so that every clone finds these code paths and files already in
# guest memory (page cache, dentries) instead of paying for them on its first exec.
# The interpreter is read whole: the agent and most first commands are python3, and a C
# function of it that no warm-up ran would otherwise fault its page in from disk in every clone.
# `env true`, not `true`: the shell's builtin would leave /usr/bin/true and the exec path
# through PATH cold.
# The last is what E2B's SDKs run first: a login bash as `user` from its home (bash, its
# profile files and the account's lookups were read from disk by each clone's first command:
# +280 ms on the E2B path's first command, bench/e2b_path.py, 2026-12-04). A guest without
# that account (the fake VMM's, which runs on the host; an image a user brings) skips it.
WARMUP_COMMANDS = ("env true", "python3 -c 'print(6*7)'", "ls / >/dev/null", "cat /etc/os-release",
                   'cat "$(readlink -f "$(command -v python3)")" >/dev/null',
                   "! id -u user >/dev/null 2>&1 || "
                   "runuser -u user -- /bin/sh -c 'cd \"$HOME\" && exec /bin/bash -l -c true'")
# `full`'s languages, each run once (python3 is in WARMUP_COMMANDS): a sandbox's first use
# finds its toolchain in memory. The go build also fills root's build cache
# ($HOME/.cache/go-build, on the template's disk), which a sandbox's first `go build` or
# `go run` then starts from instead of an empty one.
FULL_WARMUP_COMMANDS = (
    "node -e 'console.log(6*7)'",
    "bun -e 'console.log(6*7)'",
    "go version",
    "cd /tmp && printf '%s\\n' 'package main' 'import \"fmt\"' 'func main() { fmt.Println(6 * 7) }'"
    " > warm.go && go build -o warm-go warm.go && ./warm-go && rm warm-go warm.go",
    "cd /tmp && printf '%s\\n' '#include <stdio.h>' 'int main(void) { puts(\"42\"); return 0; }'"
    " > warm.c && gcc -O2 -o warm-c warm.c && ./warm-c && rm warm-c warm.c",
    "git --version >/dev/null",
    "curl --version >/dev/null && npm --version >/dev/null && make --version >/dev/null",
)
TEMPLATE_HOSTNAME = "pandastack"
# An OCI image's template warms what every image has: the agent's exec through /bin/sh.
IMAGE_WARMUP_COMMANDS = ("true",)

READY_POLL_S = 0.25
SETTLE_S = 1.0
CODE_WARMUP_TIMEOUT_S = 900.0  # the first kernel start and its imports, under TCG
CODE_SOCKET = "/run/pandastack/code.sock"
# Imported (then the names dropped, the modules stay loaded) and one figure rendered to PNG
# in the default python context, so the first run after a create finds the kernel warm.
CODE_INTERPRETER_WARMUP = """\
import numpy, pandas, pyarrow, matplotlib
import matplotlib.pyplot as plt
_pandastack_fig = plt.figure(figsize=(1, 1))
_pandastack_fig.savefig(__import__("io").BytesIO(), format="png")
plt.close(_pandastack_fig)
pandas.DataFrame({"a": [1]})._repr_html_()
del _pandastack_fig, numpy, pandas, pyarrow, matplotlib, plt
"""

Progress = Callable[[str], None]
# The guest image of a variant (images.ImageSpec name), built on first use.
ImageProvider = Callable[[str, Progress], Awaitable[GuestImage]]


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    image: str  # images.ImageSpec name
    warmup: tuple[str, ...] = ()  # run after WARMUP_COMMANDS before the snapshot
    # Another built-in whose snapshot this one is, byte for byte (same image, same warm-up):
    # creates restore that snapshot, so no second bake and no second memory file per shape.
    same_as: str | None = None
    # Started in the background (agent spawn) after the warm-up commands; the snapshot is
    # taken once `ready` passes, so every sandbox has it running from the first instant.
    start: str | None = None
    ready: ReadyCheck | None = None
    # Python code run in the code interpreter's default context (needs `start` to run the
    # interpreter), after `ready`.
    code_warmup: tuple[str, ...] = ()
    # The cwds of more python contexts made before the snapshot, each warmed with
    # `code_warmup` as the default one is: E2B's room runs in its own default context
    # (E2B_DEFAULT_CWD), which would otherwise be a cold kernel on a sandbox's first run.
    code_contexts: tuple[str, ...] = ()
    # Instead of WARMUP_COMMANDS: an image a user brings need not have python3 or bash
    # (IMAGE_WARMUP_COMMANDS, ADR 0046).
    base_warmup: tuple[str, ...] | None = None

    def key_parts(self) -> tuple[str, ...]:
        """What the guest does before its snapshot (part of the template key)."""
        parts = list(self.warmup)
        if self.base_warmup is not None:
            parts[:0] = [f"base_warmup:{c}" for c in self.base_warmup]
        if self.start is not None:
            parts.append(f"start:{self.start}")
        if self.ready is not None:
            parts.append(f"ready:{self.ready.kind}:{self.ready.value}")
        return (*parts, *(f"code:{c}" for c in self.code_warmup),
                *(f"context:{cwd}" for cwd in self.code_contexts))


BUILTIN_TEMPLATES: Mapping[str, BuiltinTemplate] = {
    t.name: t
    for t in (
        BuiltinTemplate(BASE, BASE),
        # The base image already has python3, pip, venv and a virtualenv first on PATH.
        BuiltinTemplate("python", BASE, same_as=BASE),
        BuiltinTemplate("node", "node", warmup=("node -e 'console.log(6*7)'",),
                        start=f"exec /opt/venv/bin/python /{KERNEL_SERVER_PATH}",
                        ready=ReadyCheck(kind="file", value=CODE_SOCKET)),
        # Python, Node, Go, Bun and C (git, curl, make): large, so built on its first use
        # (or by `pandastack setup --template full`), never by a plain setup.
        BuiltinTemplate("full", "full", warmup=FULL_WARMUP_COMMANDS,
                        start=f"exec /opt/venv/bin/python /{KERNEL_SERVER_PATH}",
                        ready=ReadyCheck(kind="file", value=CODE_SOCKET)),
        # The seed article's stack, installed when the image is built, imported once before
        # the snapshot so that every sandbox finds it warm in memory.
        # The interpreter (kernel_server.py) runs from the snapshot on, its default python
        # kernel already started and the stack imported in it.
        BuiltinTemplate("code-interpreter", "code-interpreter",
                        start=f"exec /opt/venv/bin/python /{KERNEL_SERVER_PATH}",
                        ready=ReadyCheck(kind="file", value=CODE_SOCKET),
                        code_warmup=(CODE_INTERPRETER_WARMUP,),
                        code_contexts=(E2B_DEFAULT_CWD,)),
    )
}


@dataclass(frozen=True)
class Template:
    name: str
    key: str
    path: Path
    snapshot: SnapshotFiles
    disk: Path
    disk_bytes: int


def template_key(image: GuestImage, driver: VMMDriver, shape: MachineShape,
                 warmup: tuple[str, ...] = (), kernel_args: str = "") -> str:
    ident = "|".join([image.key, driver.identity(), str(shape.vcpus), str(shape.memory_mb),
                      BAKE_VERSION, *WARMUP_COMMANDS, *warmup, kernel_args])
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


class TemplateStore:
    def __init__(self, root: Path, driver: VMMDriver, images: ImageProvider, *,
                 pinned: Callable[[], list[Path]] = list,
                 network: NetworkManager | None = None, memory_stage: Path | None = None,
                 memory_stage_bytes: int | None = None, kernel_args: str = ""):
        self.root = root
        self.kernel_args = kernel_args  # appended to each image's kernel command line
        self.memory_stage = memory_stage
        self.memory_stage_bytes = memory_stage_bytes  # None: the stage's default budget
        self.driver = driver
        self.images = images
        self.pinned = pinned
        self.network = network
        self._memo: dict[tuple[str, MachineShape], Template] = {}
        self._image_keys: set[str] = set()  # images this process has used: GC keeps them

    def memory_to_restore(self, template: Template) -> Path | None:
        """The template's memory file for a restore now: its staged copy again if the
        stage's bound removed it since the template was loaded (host/memory/stage.py)."""
        memory = template.snapshot.memory
        if memory is None:
            return None
        return restaged(memory, self.memory_stage, self.memory_stage_bytes)

    def load_dir(self, name: str, directory: Path) -> Template:
        """A template version by its directory (snapshots and sandboxes record it). Its
        memory file is not staged: what restores from a snapshot or a hibernation loads
        carries its own memory."""
        template = self._load(name, directory, stage=False)
        if template is None:
            raise SetupError(f"template {name} at {directory} is gone")
        return template

    def _load(self, name: str, directory: Path, *, stage: bool = True) -> Template | None:
        meta_path = directory / "template.json"
        if not meta_path.exists() or not hold_version(directory):
            return None
        meta = json.loads(meta_path.read_text())
        shape = MachineShape(vcpus=meta["vcpus"], memory_mb=meta["memory_mb"])
        snapshot = SnapshotFiles(
            memory=stage_memory(directory / "memory", self.memory_stage if stage else None,
                                self.memory_stage_bytes),
            device_state=directory / "device.state",
            kernel=KernelSpec(Path(meta["kernel"]), Path(meta["initrd"]), meta["cmdline"]),
            shape=shape,
            saved_by=meta.get("driver", ""),
        )
        return Template(name, meta["key"], directory, snapshot, self._disk(directory),
                        int(meta["disk_bytes"]))

    def _disk(self, directory: Path) -> Path:
        """A template version's disk: the bottom layer of every chain made from it."""
        return directory / f"disk{self.driver.disks.suffix}"

    async def ensure(self, name: str = "base", shape: MachineShape | None = None,
                     progress: Progress = print) -> Template:
        shape = shape or MachineShape()
        memo = self._memo.get((name, shape))
        if memo is not None:
            return memo
        builtin = BUILTIN_TEMPLATES.get(name)
        if builtin is None:
            raise TemplateNotFound(f"unknown template {name!r}")
        if builtin.same_as is not None:
            alias = replace(await self.ensure(builtin.same_as, shape, progress), name=name)
            self._memo[(name, shape)] = alias
            return alias
        image = await self.images(builtin.image, progress)
        return await self._ensure_baked(name, image, builtin, shape, progress)

    async def ensure_image(self, name: str, image: GuestImage, shape: MachineShape | None = None,
                           progress: Progress = print) -> Template:
        """A template of a guest image made from an OCI image (images/oci/guest_image.py),
        baked on first use like a built-in but with IMAGE_WARMUP_COMMANDS; creates of `name`
        in this process restore it."""
        if name in BUILTIN_TEMPLATES:
            raise SetupError(f"{name!r} is a built-in template's name")
        shape = shape or MachineShape()
        builtin = BuiltinTemplate(name, image.variant, base_warmup=IMAGE_WARMUP_COMMANDS)
        return await self._ensure_baked(name, image, builtin, shape, progress)

    async def _ensure_baked(self, name: str, image: GuestImage, builtin: BuiltinTemplate,
                            shape: MachineShape, progress: Progress) -> Template:
        self._image_keys.add(image.key)
        key = template_key(image, self.driver, shape, builtin.key_parts(), self.kernel_args)
        final = self.root / name / key
        template = await asyncio.to_thread(self._load, name, final)  # may stage its memory
        if template is None:
            final.parent.mkdir(parents=True, exist_ok=True)
            lock = await asyncio.to_thread(_lock, final.parent / ".lock")
            try:
                template = await asyncio.to_thread(self._load, name, final)
                if template is None:
                    await self._bake_fresh(name, key, final, shape, image, builtin, progress)
                    template = await asyncio.to_thread(self._load, name, final)
            finally:
                os.close(lock)
        if template is None:
            raise SetupError(f"template {name} was baked but cannot be loaded from {final}")
        self._memo[(name, shape)] = template
        # Once per process and template: old versions left by earlier code go away.
        await asyncio.to_thread(self._prune, name, final, image, progress)
        return template

    def _prune(self, name: str, just_baked: Path, image: GuestImage, progress: Progress) -> None:
        keep = [just_baked, *(t.path for t in self._memo.values()), *self.pinned()]
        # Only this template's old versions: the current version of the others is not known
        # here unless they were used (their images would have to be resolved first).
        prune_templates(self.root, keep, names=[name], progress=progress)
        sweep_staged_memory(self.memory_stage, progress)
        prune_images(image.rootfs.parent.parent, self.root, sorted(self._image_keys),
                     progress=progress)

    async def _bake_fresh(self, name: str, key: str, final: Path, shape: MachineShape,
                          image: GuestImage, builtin: BuiltinTemplate,
                          progress: Progress) -> None:
        """Bake, booting again (up to BAKE_ATTEMPTS boots) when the guest came up with a
        periodic tick: that state is the boot's (a clocksource dropped), not the image's."""
        for attempt in range(1, BAKE_ATTEMPTS + 1):
            try:
                await self._bake(name, key, final, shape, image, builtin, progress)
                return
            except tick.PeriodicTick as exc:
                if attempt == BAKE_ATTEMPTS:
                    raise
                progress(f"template {name}: boot {attempt} of {BAKE_ATTEMPTS} kept a periodic "
                         f"tick, booting again ({str(exc).splitlines()[0]})")

    async def _bake(self, name: str, key: str, final: Path, shape: MachineShape,
                    image: GuestImage, builtin: BuiltinTemplate, progress: Progress) -> None:
        work = final.with_name(f"{key}.tmp-{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        kernel = KernelSpec(image.kernel, image.initrd, image.cmdline + self.kernel_args)
        disk = self._disk(work)
        self.driver.disks.create_base(disk, image.rootfs)
        paths = VMPaths(work / "vm")
        started = time.monotonic()
        progress(f"template {name}: cold boot ({self.driver.accel}, {shape.vcpus} vCPU, "
                 f"{shape.memory_mb} MiB)")
        slot = None
        if self.network is not None:  # the template's NIC needs a tap to attach to
            slot = self.network.claim(work)
            await asyncio.to_thread(self.network.setup, slot, NetworkPolicy(internet=False))
        try:
            vm = self.driver.boot(paths, kernel, disk, work / "memory", shape,
                                  netns=slot.netns if slot else None)
            await self._bake_running(name, vm, paths, work, started, builtin, progress)
        finally:
            if slot is not None and self.network is not None:
                await asyncio.to_thread(self.network.teardown, slot)
                self.network.release(slot)
        shutil.rmtree(paths.workdir, ignore_errors=True)
        for part in ("memory", "device.state", disk.name):
            os.chmod(work / part, 0o444)
            fsync_path(work / part)  # a template must survive a host crash whole
        meta = {
            "name": name, "key": key, "vcpus": shape.vcpus, "memory_mb": shape.memory_mb,
            "kernel": str(kernel.kernel), "initrd": str(kernel.initrd),
            "cmdline": kernel.cmdline, "image_key": image.key, "image": image.variant,
            "driver": self.driver.identity(),
            "disk_bytes": self.driver.disks.virtual_size(disk),
            "baked_at": time.time(), "bake_seconds": round(time.monotonic() - started, 2),
        }
        (work / "template.json").write_text(json.dumps(meta, indent=2))
        fsync_path(work / "template.json")
        os.replace(work, final)
        progress(f"template {name}: ready in {meta['bake_seconds']}s")

    async def _bake_running(self, name: str, vm: VMProcess, paths: VMPaths, work: Path,
                            started: float, builtin: BuiltinTemplate,
                            progress: Progress) -> None:
        agent: AgentClient | None = None
        try:
            agent = await _connect_booting(paths, vm.is_alive)
            progress(f"template {name}: agent up after {time.monotonic() - started:.1f}s; warming")
            # The same `init` every clone gets first: the guest code and files it touches are
            # then in the snapshot's memory, not read from disk by each clone. Each clone sets
            # its own identity over this one.
            await agent.init(time_ns=time.time_ns(), entropy=os.urandom(64),
                             hostname=TEMPLATE_HOSTNAME,
                             machine_id=hashlib.sha256(name.encode()).hexdigest()[:32])
            base_warmup = WARMUP_COMMANDS if builtin.base_warmup is None else builtin.base_warmup
            for cmd in (*base_warmup, *builtin.warmup):
                result = await agent.exec(cmd, timeout=300)  # imports are slow under TCG
                if result.exit_code != 0:
                    raise SetupError(f"warm-up {cmd!r} failed: {result.stderr!r}")
            if builtin.start is not None:
                t0 = time.monotonic()
                pid = await start_service(agent, builtin.start, builtin.ready)
                progress(f"template {name}: {builtin.start!r} ready after "
                         f"{time.monotonic() - t0:.1f}s")
                for code in builtin.code_warmup:
                    t0 = time.monotonic()
                    await _warm_code(agent, code, pid, builtin.start)
                    progress(f"template {name}: code warm-up took {time.monotonic() - t0:.1f}s")
                for cwd in builtin.code_contexts:
                    t0 = time.monotonic()
                    context_id = await _make_context(agent, cwd, pid, builtin.start)
                    for code in builtin.code_warmup:
                        await _warm_code(agent, code, pid, builtin.start, context_id)
                    progress(f"template {name}: context {cwd!r} made and warmed in "
                             f"{time.monotonic() - t0:.1f}s")
            # A guest whose clocksource watchdog dropped the TSC keeps a periodic tick that
            # every clone would inherit (tick.py): such a bake must not be saved. Checked
            # before the settle, which then also clears up after the probe's own exec. Only a
            # driver that boots a guest kernel has a tick to check (the tests' stand-in VMM
            # runs the agent on the host, whose timer list is not the guest's).
            if self.driver.accel in GUEST_KERNEL_ACCELS:
                state = await tick.check(agent)
                progress(f"template {name}: tick {state.describe()}")
            await agent.sync()
            # Let the guest finish the work the warm-up left behind (RCU callbacks freeing
            # exited tasks, cgroups being released) before the snapshot: otherwise every clone
            # does it again, on its way to its first exec.
            await asyncio.sleep(SETTLE_S)
            progress(f"template {name}: saving snapshot")
            await self.driver.save(vm, work / "device.state")
        except BaseException:
            tail = _tail(paths.console_log)
            vm.kill()
            shutil.rmtree(work, ignore_errors=True)
            if tail:
                progress(f"template {name}: bake failed; guest console ends with:\n{tail}")
            raise
        finally:
            if agent is not None:
                await agent.close()
        vm.kill()


async def start_service(agent: AgentClient, start: str, ready: ReadyCheck | None) -> int:
    """Spawn `start` (sh -c) in the guest and poll `ready` until it passes; its pid.

    SetupError, naming the check and ending with the command's output, if the command exits
    first or the check does not pass in time."""
    pid = await agent.spawn(start)
    if ready is None:
        return pid
    deadline = time.monotonic() + ready.timeout_seconds
    while not await _is_ready(agent, ready):
        exited = exit_code_of(await agent.procs(), pid)
        if exited is None and time.monotonic() < deadline:
            await asyncio.sleep(READY_POLL_S)
            continue
        check = f"{ready.kind} {ready.value}"
        why = (f"exited with code {exited} before it was ready ({check})" if exited is not None
               else f"was not ready ({check}) after {ready.timeout_seconds:g} s")
        raise SetupError(f"start command {start!r} {why}; its output ends with:\n"
                         + await _output_tail(agent, pid))
    return pid


async def _is_ready(agent: AgentClient, ready: ReadyCheck) -> bool:
    if ready.kind == "file":
        try:
            await agent.stat(ready.value)
        except GuestOSError:
            return False
        return True
    if ready.kind == "port":
        # bash's /dev/tcp: a connect without starting an interpreter (slow under TCG).
        argv = ["bash", "-c", ': <>"/dev/tcp/127.0.0.1/$0"', ready.value]
        return (await agent.exec(argv, timeout=10)).exit_code == 0
    return (await agent.exec(ready.value, timeout=60)).exit_code == 0


async def _output_tail(agent: AgentClient, pid: int, lines: int = 30) -> str:
    """The last lines a background process wrote (stdout, then stderr)."""
    chunks: list[bytes] = []
    try:
        result = await agent.attach(pid, on_stdout=chunks.append, on_stderr=chunks.append,
                                    timeout=1.0)
        text = (result.stdout + result.stderr).decode(errors="replace")
    except HostError:  # still running: what arrived before the wait ended
        text = b"".join(chunks).decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


async def _make_context(agent: AgentClient, cwd: str, pid: int, start: str) -> str:
    try:
        made = await code_client.create_context(agent, "python", cwd)
    except HostError as exc:
        raise SetupError(f"code context in {cwd!r} not made: {exc}; the output of {start!r} "
                         "ends with:\n" + await _output_tail(agent, pid)) from exc
    return str(made["id"])


async def _warm_code(agent: AgentClient, code: str, pid: int, start: str,
                     context_id: str | None = None) -> None:
    try:
        async with contextlib.aclosing(code_client.run_code(
                agent, code, context_id=context_id, timeout=CODE_WARMUP_TIMEOUT_S,
                store_history=False)) as events:
            async for event in events:
                if event.type == "error":
                    raise SetupError(f"code warm-up failed: {event.name}: {event.value}\n"
                                     f"{event.traceback}")
    except HostError as exc:
        if isinstance(exc, SetupError):
            raise
        raise SetupError(f"code warm-up failed: {exc}; the output of {start!r} ends with:\n"
                         + await _output_tail(agent, pid)) from exc


async def _connect_booting(paths: VMPaths, alive: Callable[[], bool]) -> AgentClient:
    deadline = time.monotonic() + BOOT_DEADLINE_S
    while True:
        if not alive():
            raise SetupError("the VM exited during boot: " + _tail(paths.console_log))
        tried = time.monotonic()
        try:
            return await AgentClient.connect(paths.agent_socket, timeout=5)
        except Exception as exc:
            if time.monotonic() > deadline:
                raise SetupError(f"guest agent did not come up in {BOOT_DEADLINE_S}s: {exc}; "
                                 + _tail(paths.console_log)) from exc
            # An attempt that failed at once is not tried again at once: a loop spinning on
            # one took a core from the guest it waits for.
            await asyncio.sleep(max(0.0, tried + BOOT_RETRY_S - time.monotonic()))


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
