"""A Dockerfile subset, read into a `TemplateSpec`.

Supported: `FROM <base> [AS <name>]`: a pandastack template (a built-in name such as `base`,
the team's template, or `snapshot:<id>`) or an OCI image (`python:3.12-slim`,
`ghcr.io/acme/env@sha256:...`: templatespec/base.py says which); several `FROM`s make a
multi-stage build, whose last stage is the template and whose earlier ones are only copied
from (`COPY --from=<name|index|image> <src>... <dst>`; stages the last one does not need
are dropped, as BuildKit does); `ARG <name>[=<default>]` (before the first FROM: for FROM
lines, and redeclared inside a stage for it; values from `build_args`), substituted in
FROM, ENV, COPY, WORKDIR and USER and given to RUN as environment variables (an ENV of the
same name wins, as in Docker); `RUN` (shell form or JSON exec form); `COPY`/`ADD <src>...
<dst>` (sources from the build context, globs allowed; `ADD` only for plain local files);
`ENV` (`k=v ...` and `k v`); `WORKDIR`; `USER <user>[:<group>]` (names or ids); `CMD` and
`ENTRYPOINT` (shell or JSON form; the last stage's are the template's start command);
`EXPOSE <port>[/<protocol>]...` (ranges too, ARGs substituted; the last stage's are the
spec's `exposed_ports`). Backslash
continuations, comments and blank lines follow Docker's rules. `LABEL` and `MAINTAINER` are
metadata and are ignored. Everything else (`FROM` an earlier stage, `ADD <url>`, other
instruction flags, heredocs, ...) is a `ValueError` naming its line.

Readiness of the start command comes from comment directives:

    # pandastack: ready port 8000            (or: ready file /tmp/up, ready command <cmd>)
    # pandastack: ready-timeout 60           (seconds; default 120)

and `# pandastack: start image` makes a FROM image's own Entrypoint and Cmd the start
command (with no CMD or ENTRYPOINT in the Dockerfile).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from pydantic import ValidationError

from pandastack.rules import MAX_TEMPLATE_STAGES

from .builder import CopyBudget, copy_step
from .models import (
    DEFAULT_READY_TIMEOUT_SECONDS,
    CopyFromStep,
    EnvStep,
    ReadyCheck,
    RunStep,
    StageSpec,
    TemplateSpec,
    TemplateStep,
    UserStep,
    WorkdirStep,
)
from .ports import MAX_EXPOSED_PORTS, expose_ports, unique
from .stages import ArgScope, prune_stages

IGNORED = frozenset({"LABEL", "MAINTAINER"})
UNSUPPORTED = frozenset({"SHELL", "HEALTHCHECK", "VOLUME", "STOPSIGNAL", "ONBUILD"})
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")
_DIRECTIVE_RE = re.compile(r"^#\s*pandastack\s*:\s*(.*)$", re.IGNORECASE)
_PARSER_DIRECTIVE_RE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(.*?)\s*$")
_INSTRUCTION_RE = re.compile(r"^\s*([A-Za-z]+)(?:\s+(.*))?$", re.DOTALL)
_HEREDOC_RE = re.compile(r"<<-?\s*[\"']?[A-Za-z_]")

DirectiveHandler = Callable[[int, str], None]


def from_dockerfile(text: str, context_dir: Path | None = None,
                    build_args: Mapping[str, str] | None = None) -> TemplateSpec:
    """Parse the Dockerfile subset; `context_dir` is where COPY sources are read from,
    `build_args` the values of its ARGs (`docker build --build-arg`; names it does not
    declare are ignored)."""
    parser = _Parser(context_dir, build_args or {})
    for lineno, line in _logical_lines(text, parser.directive):
        try:
            parser.instruction(line)
        except ValidationError as exc:
            raise ValueError(f"Dockerfile line {lineno}: {_messages(exc)}") from None
        except ValueError as exc:
            raise ValueError(f"Dockerfile line {lineno}: {exc}") from None
    try:
        return parser.finish()
    except ValidationError as exc:
        raise ValueError(f"Dockerfile: {_messages(exc)}") from None


def _messages(exc: ValidationError) -> str:
    return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())


def _logical_lines(text: str, directive: DirectiveHandler) -> Iterator[tuple[int, str]]:
    """Instructions with their first line's number, continuations joined the way Docker does
    (the backslash and newline removed; comment and blank lines inside skipped)."""
    parts: list[str] = []
    start = 0
    leading = True  # parser directives (`# escape=`) are only valid before anything else
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if "\0" in raw:
            raise ValueError(f"Dockerfile line {lineno}: NUL byte")
        stripped = raw.strip()
        if stripped.startswith("#"):
            match = _PARSER_DIRECTIVE_RE.match(stripped)
            if leading and match and match.group(1).lower() == "escape" and match.group(2) != "\\":
                raise ValueError(f"Dockerfile line {lineno}: only the default escape "
                                 "character (backslash) is supported")
            found = _DIRECTIVE_RE.match(stripped)
            if found:
                directive(lineno, found.group(1))
            continue
        leading = False
        if not stripped:
            continue
        if not parts:
            start = lineno
        body = raw.rstrip()
        if body.endswith("\\"):
            parts.append(body[:-1])
            continue
        parts.append(raw)
        yield start, "".join(parts)
        parts = []
    if parts:
        yield start, "".join(parts)


def _json_list(args: str) -> list[str] | None:
    """The JSON (exec) form if `args` is one, like Docker: anything else is shell form."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


class _Parser:
    def __init__(self, context_dir: Path | None, build_args: Mapping[str, str]) -> None:
        self.context = context_dir.absolute() if context_dir is not None else None
        self.from_template: str | None = None
        self.steps: list[TemplateStep] = []
        self.stages: list[StageSpec] = []  # the earlier stages, finished
        self.stage_names: dict[str, int] = {}
        self.stage_name: str | None = None
        self.args = ArgScope(build_args)
        self.cmd: str | list[str] | None = None
        self.entrypoint: str | list[str] | None = None
        self.ready: tuple[str, str] | None = None
        self.ready_timeout = DEFAULT_READY_TIMEOUT_SECONDS
        self.start_image = False
        self.exposed: list[str] = []
        self.budget = CopyBudget()

    def directive(self, lineno: int, text: str) -> None:
        words = text.split(None, 2)
        try:
            if len(words) == 3 and words[0].lower() == "ready":
                if words[1] not in ("port", "file", "command"):
                    raise ValueError(f"unknown ready check {words[1]!r}")
                self.ready = (words[1], words[2].strip())
                ReadyCheck(kind=words[1], value=self.ready[1])  # type: ignore[arg-type]
            elif len(words) == 2 and [w.lower() for w in words] == ["start", "image"]:
                self.start_image = True
            elif len(words) == 2 and words[0].lower() == "ready-timeout":
                self.ready_timeout = float(words[1])
                ReadyCheck(kind="file", value="-", timeout_seconds=self.ready_timeout)
            else:
                raise ValueError("expected 'ready port|file|command <value>', "
                                 "'ready-timeout <seconds>' or 'start image'")
        except ValueError as exc:
            why = _messages(exc) if isinstance(exc, ValidationError) else str(exc)
            raise ValueError(f"Dockerfile line {lineno}: bad pandastack directive: {why}") \
                from None

    def instruction(self, line: str) -> None:
        match = _INSTRUCTION_RE.match(line)
        if match is None:
            raise ValueError(f"cannot parse {line.strip()[:80]!r}")
        name, args = match.group(1).upper(), (match.group(2) or "").strip()
        if name == "FROM":
            return self._from(args)
        if name == "ARG":
            return self._arg(args)
        if self.from_template is None:
            raise ValueError("the first instruction must be FROM <template> (or ARG)")
        if name in IGNORED:
            return None
        if name in UNSUPPORTED:
            raise ValueError(f"{name} is not supported")
        handler = {"RUN": self._run, "COPY": self._copy, "ADD": self._add, "ENV": self._env,
                   "WORKDIR": self._workdir, "USER": self._user, "CMD": self._cmd,
                   "ENTRYPOINT": self._entrypoint, "EXPOSE": self._expose}.get(name)
        if handler is None:
            raise ValueError(f"unknown instruction {name}")
        if not args:
            raise ValueError(f"{name} needs arguments")
        return handler(args)

    def _from(self, args: str) -> None:
        words = args.split()
        if words and words[0].startswith("--"):
            raise ValueError(f"FROM flags are not supported: {words[0]}")
        if len(words) == 3 and words[1].lower() == "as":
            name: str | None = words[2].lower()
        elif len(words) == 1:
            name = None
        else:
            raise ValueError("FROM takes a template name or image reference, and AS <name>")
        base = self.args.substitute(words[0], in_from=True)
        if not base:
            raise ValueError(f"FROM {words[0]}: empty after ARG substitution")
        if self.from_template is not None:
            self._end_stage()
        if base.lower() in self.stage_names:
            raise ValueError(f"FROM an earlier stage ({base}) is not supported; "
                             f"COPY --from={base} what you need")
        if name is not None and (name in self.stage_names or name.isdigit()):
            raise ValueError(f"stage name {name!r} is used twice or is a number")
        if len(self.stages) + 1 > MAX_TEMPLATE_STAGES:
            raise ValueError(f"more than {MAX_TEMPLATE_STAGES} stages")
        self.from_template, self.stage_name = base, name
        self.args.new_stage()

    def _end_stage(self) -> None:
        assert self.from_template is not None
        self.stages.append(StageSpec(name=self.stage_name, from_template=self.from_template,
                                     steps=self.steps))
        if self.stage_name is not None:
            self.stage_names[self.stage_name] = len(self.stages) - 1
        self.steps = []
        # A stage's CMD, ENTRYPOINT and EXPOSE are its image's; only the last stage's count.
        self.cmd = self.entrypoint = None
        self.exposed = []

    def _arg(self, args: str) -> None:
        if args.startswith("--"):
            raise ValueError(f"ARG flags are not supported: {args.split()[0]}")
        try:
            words = shlex.split(args)
        except ValueError as exc:
            raise ValueError(f"ARG: {exc}") from None
        if not words:
            raise ValueError("ARG needs a name")
        for word in words:
            self.args.declare(word, global_scope=self.from_template is None)

    def _run(self, args: str) -> None:
        if args.startswith("--"):
            raise ValueError(f"RUN flags are not supported: {args.split()[0]}")
        if _HEREDOC_RE.match(args):
            raise ValueError("heredocs are not supported")
        argv = _json_list(args)
        self.steps.append(RunStep(command=self.args.run_env(argv if argv is not None
                                                            else args)))

    def _copy_from(self, source: str, tokens: list[str]) -> None:
        if len(tokens) < 2:
            raise ValueError("COPY needs a source and a destination")
        if tokens[0].startswith("--"):
            raise ValueError(f"COPY flags are not supported: {tokens[0]}")
        key = self.args.substitute(source).lower()
        if key in self.stage_names:
            stage = self.stage_names[key]
        elif key.isdigit():
            stage = int(key)
            if stage >= len(self.stages):
                raise ValueError(f"COPY --from={source}: there is no earlier stage {stage}")
        else:  # an image or template of its own: a stage without steps
            if len(self.stages) + 2 > MAX_TEMPLATE_STAGES:
                raise ValueError(f"more than {MAX_TEMPLATE_STAGES} stages (COPY --from an "
                                 "image is one)")
            self.stages.append(StageSpec(from_template=self.args.substitute(source),
                                         steps=[]))
            stage = len(self.stages) - 1
        *sources, dst = (self.args.substitute(t) for t in tokens)
        self.steps.append(CopyFromStep(stage=stage, sources=sources, dst=dst))

    def _copy(self, args: str, instruction: str = "COPY") -> None:
        tokens = _json_list(args) or args.split()
        if instruction == "COPY" and tokens[0].startswith("--from="):
            return self._copy_from(tokens[0].removeprefix("--from="), tokens[1:])
        tokens = [self.args.substitute(t) for t in tokens]
        if tokens[0].startswith("--"):
            raise ValueError(f"{instruction} flags are not supported: {tokens[0]}")
        if len(tokens) < 2:
            raise ValueError(f"{instruction} needs a source and a destination")
        if self.context is None:
            raise ValueError(f"{instruction} needs a build context directory")
        *sources, dst = tokens
        paths: list[Path] = []
        for src in sources:
            if "://" in src:
                raise ValueError(f"{instruction} from a URL is not supported: {src}")
            rel = src.lstrip("/") or "."
            if any(c in rel for c in "*?["):
                matches = sorted(self.context.glob(rel))
                if not matches:
                    raise ValueError(f"no file in the build context matches {src}")
                paths += matches
            else:
                paths.append(self.context / rel)
        self.steps.append(copy_step(paths, dst, root=self.context, budget=self.budget))

    def _add(self, args: str) -> None:
        tokens = _json_list(args) or args.split()
        for src in tokens[:-1]:
            src = self.args.substitute(src)
            if "://" in src:
                raise ValueError(f"ADD from a URL is not supported: {src}")
            if src.lower().endswith(ARCHIVES):
                raise ValueError("ADD of an archive (which Docker unpacks) is not supported; "
                                 "COPY it and RUN tar")
        self._copy(args, "ADD")

    def _env(self, args: str) -> None:
        values = self._env_values(args)
        self.args.shadow(values)
        self.steps.append(EnvStep(env=values))

    def _env_values(self, args: str) -> dict[str, str]:
        first = args.split(None, 1)[0]
        values: dict[str, str] = {}
        if "=" in first:
            try:
                # shlex would turn `\$` into `$`; keep it escaped for the build's expansion.
                words = shlex.split(args.replace("\\$", "\\\\$"))
            except ValueError as exc:
                raise ValueError(f"ENV: {exc}") from None
            for word in words:
                name, eq, value = word.partition("=")
                if not eq:
                    raise ValueError(f"ENV: expected NAME=VALUE, got {word!r}")
                values[name] = self.args.substitute(value)
        else:
            parts = args.split(None, 1)
            if len(parts) != 2:
                raise ValueError("ENV: expected NAME VALUE or NAME=VALUE ...")
            values[parts[0]] = self.args.substitute(parts[1])
        return values

    def _workdir(self, args: str) -> None:
        self.steps.append(WorkdirStep(path=self.args.substitute(args)))

    def _user(self, args: str) -> None:
        self.steps.append(UserStep(name=self.args.substitute(args)))

    def _cmd(self, args: str) -> None:
        self.cmd = _json_list(args) or args

    def _entrypoint(self, args: str) -> None:
        self.entrypoint = _json_list(args) or args

    def _expose(self, args: str) -> None:
        for word in args.split():
            value = self.args.substitute(word)
            try:
                self.exposed = unique([*self.exposed, *expose_ports(value)])
            except ValueError as exc:
                # The ENV of earlier steps may expand against the guest's, so only ARGs here.
                hint = " (ARGs are substituted in EXPOSE, ENV values are not)" \
                    if "$" in value else ""
                raise ValueError(f"EXPOSE {exc}{hint}") from None
        if len(self.exposed) > MAX_EXPOSED_PORTS:
            raise ValueError(f"EXPOSE: more than {MAX_EXPOSED_PORTS} ports in all")

    def _start(self) -> str | None:
        entry, cmd = self.entrypoint, self.cmd
        if entry is None:
            return shlex.join(cmd) if isinstance(cmd, list) else cmd
        if isinstance(entry, str):  # shell form ENTRYPOINT ignores CMD, as in Docker
            return entry
        if isinstance(cmd, str):
            entry = [*entry, "/bin/sh", "-c", cmd]
        elif cmd is not None:
            entry = [*entry, *cmd]
        return shlex.join(entry)

    def finish(self) -> TemplateSpec:
        if self.from_template is None:
            raise ValueError("Dockerfile has no FROM")
        ready = None
        if self.ready is not None:
            ready = ReadyCheck(kind=self.ready[0], value=self.ready[1],  # type: ignore[arg-type]
                               timeout_seconds=self.ready_timeout)
        stages, steps = prune_stages(self.stages, self.steps)
        return TemplateSpec(from_template=self.from_template, steps=steps,
                            start=self._start() or None, ready=ready, stages=stages,
                            start_from_image=self.start_image or None,
                            exposed_ports=self.exposed)
