"""What one template build step does inside the build sandbox, and the output plumbing.

Build steps are untrusted code: they only ever run inside the build's microVM, through the
guest agent. ENV and USER change nothing in the guest; they are applied on the host to the
`BuildState` later steps run with (so a build resumed from the cache replays them for free).
"""

from __future__ import annotations

import posixpath
import shlex
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.hostport.errors import AgentError, BuildFailed
from pandastack.hostport.results import ExecResult
from pandastack.templatespec import (
    DEFAULT_WORKDIR,
    AptStep,
    CopyStep,
    EnvStep,
    NpmStep,
    PipStep,
    ReadyCheck,
    RunStep,
    TemplateStep,
    UserStep,
    WorkdirStep,
    expand_env,
)

Log = Callable[[str], None]
TAIL_LINES = 40
MAX_LINE_BYTES = 8192  # a longer line (a progress bar without newlines) is cut into pieces
APT_INSTALL = "apt-get update && DEBIAN_FRONTEND=noninteractive " \
              "apt-get install -y --no-install-recommends "


@dataclass
class BuildState:
    """What later steps run with: ENV so far (expanded), the working directory, the user."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    guest_env: dict[str, str] | None = None  # the agent's default environment, read once

    def path(self, value: str) -> str:
        """A guest path, relative ones resolved against the working directory."""
        return posixpath.normpath(posixpath.join(self.workdir or DEFAULT_WORKDIR, value))


def user_of(spec: str | None) -> str | None:
    """Who steps run as for a User/USER spelled `name`, `uid`, `name:group`, `uid:gid` (or
    mixed): the spec as the guest agent's exec-as-user takes it (the path `sandbox.exec(...,
    user=...)` takes), None for root with root's group (steps then run as the agent, root).

    The agent resolves it from the image's /etc/passwd and /etc/group as Docker does: images
    need no `runuser` or `su` (busybox, Alpine and distroless ones have none); a uid the
    passwd file lacks runs as that bare uid (HOME=/, gid 0 unless one is given); an explicit
    group replaces the passwd entry's groups; an unknown group *name* fails the step."""
    user, sep, group = (spec or "").strip().partition(":")
    # Docker reads an empty user part (`:staff`) as the current user, root here.
    user = user or "0"
    if user in ("root", "0") and group in ("", "root", "0"):
        return None
    return f"{user}:{group}" if sep and group else user


class Output:
    """Collects a command's output: complete lines go to the build log as they arrive, the
    last TAIL_LINES are kept for the error message."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = {"stdout": b"", "stderr": b""}

    def stdout(self, data: bytes) -> None:
        self._feed("stdout", data)

    def stderr(self, data: bytes) -> None:
        self._feed("stderr", data)

    def _feed(self, stream: str, data: bytes) -> None:
        *lines, rest = (self._partial[stream] + data).split(b"\n")
        while len(rest) > MAX_LINE_BYTES:
            lines.append(rest[:MAX_LINE_BYTES])
            rest = rest[MAX_LINE_BYTES:]
        for line in lines:
            self._emit(line)
        self._partial[stream] = rest

    def flush(self) -> None:
        for stream, rest in self._partial.items():
            if rest:
                self._emit(rest)
            self._partial[stream] = b""

    def _emit(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        self.tail.append(text)
        self.log(text)

    def text(self) -> str:
        return "\n".join(self.tail)


def failure(number: int, total: int, title: str, why: str, out: Output | None,
            exit_code: int | None = None) -> BuildFailed:
    output = out.text() if out is not None else ""
    message = f"step {number}/{total} {title} {why}"
    if output:
        message += f"; last output:\n{output}"
    return BuildFailed(message, step=number, instruction=title, exit_code=exit_code,
                       output=output)


async def apply_host_step(sandbox: SandboxHandle, step: EnvStep | UserStep,
                          state: BuildState) -> None:
    if isinstance(step, UserStep):
        state.user = user_of(step.name)
        return
    known = dict(state.env)
    if any("$" in v for v in step.env.values()):
        known = {**await guest_env(sandbox, state), **state.env}
    # Like Docker: every value of one ENV step sees the variables as they were before it.
    for name, value in step.env.items():
        state.env[name] = expand_env(value, known)


async def replay_step(sandbox: SandboxHandle, step: TemplateStep, state: BuildState) -> None:
    """A cached step's effect on what later steps run with (its changes to the guest are in
    the snapshot the build resumed from)."""
    if isinstance(step, EnvStep | UserStep):
        await apply_host_step(sandbox, step, state)
    elif isinstance(step, WorkdirStep):
        state.workdir = await workdir_target(sandbox, step.path, state)


async def workdir_target(sandbox: SandboxHandle, path: str, state: BuildState) -> str:
    known = {**await guest_env(sandbox, state), **state.env} if "$" in path else state.env
    return state.path(expand_env(path, known))


async def guest_env(sandbox: SandboxHandle, state: BuildState) -> dict[str, str]:
    if state.guest_env is None:
        result = await sandbox.exec(["env", "-0"], timeout=60)
        text = result.stdout.decode(errors="replace")
        pairs = (item.split("=", 1) for item in text.split("\0") if item)
        state.guest_env = {p[0]: p[1] for p in pairs if len(p) == 2}
    return state.guest_env


async def run_step(sandbox: SandboxHandle, step: TemplateStep, state: BuildState, *,
                   number: int, total: int, title: str, timeout: float, log: Log) -> None:
    """Run one step in the build sandbox; raises BuildFailed naming it if it fails."""
    if isinstance(step, EnvStep | UserStep):
        await apply_host_step(sandbox, step, state)
        return
    out = Output(log)
    try:
        result = await _guest_step(sandbox, step, state, timeout, out)
    except AgentError as exc:
        out.flush()
        why = f"failed: {exc}"
        why = unknown_user(state.user, str(exc)) or why
        raise failure(number, total, title, why, out) from exc
    out.flush()
    if result is None:
        return
    if result.timed_out:
        raise failure(number, total, title, f"timed out after {timeout:g}s", out)
    if result.exit_code != 0:
        raise failure(number, total, title, f"failed with exit code {result.exit_code}", out,
                      result.exit_code)


async def _guest_step(sandbox: SandboxHandle, step: TemplateStep, state: BuildState,
                      timeout: float, out: Output) -> ExecResult | None:
    async def run(argv: list[str], *, as_root: bool = False) -> ExecResult:
        return await sandbox.exec(argv, timeout=timeout, env=state.env or None,
                                  cwd=state.workdir, on_stdout=out.stdout,
                                  on_stderr=out.stderr, user=None if as_root else state.user)

    match step:
        case AptStep(packages=packages):
            # Always as root: the package manager needs it, whatever USER says.
            return await run(["sh", "-c", APT_INSTALL + shlex.join(packages)], as_root=True)
        case PipStep(packages=packages):
            return await run(["pip", "install", "--no-input", "--disable-pip-version-check",
                              *packages])
        case NpmStep(packages=packages):
            return await run(["npm", "install", "-g", *packages])
        case RunStep(command=command):
            return await run(["sh", "-c", command] if isinstance(command, str) else command)
        case CopyStep(dst=dst, files=files):
            base = state.path(dst)
            for item in files:
                await sandbox.write_file(posixpath.join(base, item.path), item.content(),
                                         mode=item.mode)
            return None
        case WorkdirStep(path=path):
            target = await workdir_target(sandbox, path, state)
            # Created for the current user, as Docker's BuildKit does; an existing directory
            # is left as it is.
            made = await run(["sh", "-c", 'if [ ! -d "$1" ]; then mkdir -p -- "$1" && '
                              '{ [ -z "$2" ] || chown -- "$2" "$1"; }; fi', "sh", target,
                              state.user or ""], as_root=True)
            if made.exit_code == 0:
                state.workdir = target
            return made
    raise AssertionError(f"unhandled step {step!r}")


def unknown_user(user: str | None, error: str) -> str | None:
    """The build error for an agent's "no such user" or "no such group", naming what the
    guest's files lack (an agent older than USER's group forms says no such user for any
    `user:group`)."""
    if user is None:
        return None
    name, _, group = user.partition(":")
    where = "(named by USER or the image's User; create it in an earlier step)"
    if "no such group" in error:
        return f"failed: no group {group!r} in the base's /etc/group {where}"
    if "no such user" not in error:
        return None
    if group:
        return (f"failed: no user {name!r} in the base's /etc/passwd {where}, or the base's "
                f"guest agent predates USER user:group ({user!r}; rebuild the base)")
    return f"failed: no user {name!r} in the base's /etc/passwd {where}"


def ready_probe(check: ReadyCheck, state: BuildState) -> tuple[list[str], str | None]:
    """The command that exits 0 once the start command counts as ready, and its user (a
    command check runs as the start command's user; port and file checks as root)."""
    if check.kind == "port":
        # bash's /dev/tcp: a connect without starting an interpreter (slow under TCG).
        script = '{ : <>"/dev/tcp/127.0.0.1/$0"; } 2>/dev/null || : <>"/dev/tcp/::1/$0"'
        return ["bash", "-c", script, str(check.port)], None
    if check.kind == "file":
        # The shell's builtin: an image's PATH (its config's Env) may hold no `test` binary.
        return ["sh", "-c", 'test -e "$1"', "sh", state.path(check.value)], None
    return ["sh", "-c", check.value], state.user
