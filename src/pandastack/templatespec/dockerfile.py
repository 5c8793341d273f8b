"""A Dockerfile subset, read into a `TemplateSpec`.

Supported: one `FROM` first: a pandastack template (a built-in name such as `base`, the
team's template, or `snapshot:<id>`) or an OCI image (`python:3.12-slim`,
`ghcr.io/acme/env@sha256:...`: templatespec/base.py says which); `RUN` (shell form or JSON
exec form); `COPY`/`ADD <src>... <dst>` (sources from the build context, globs allowed;
`ADD` only for plain local files); `ENV` (`k=v ...` and `k v`); `WORKDIR`; `USER <name>`;
`CMD` and `ENTRYPOINT` (shell or JSON form; the result is the template's start command).
Backslash continuations, comments and blank lines follow Docker's rules. `EXPOSE`, `LABEL`
and `MAINTAINER` are metadata and are ignored. Everything else (`ARG`, multi-stage builds,
`ADD <url>`, instruction flags, heredocs, ...) is a `ValueError` naming its line.

Readiness of the start command comes from comment directives:

    # pandastack: ready port 8000            (or: ready file /tmp/up, ready command <cmd>)
    # pandastack: ready-timeout 60           (seconds; default 120)
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import ValidationError

from .builder import CopyBudget, copy_step
from .models import (
    DEFAULT_READY_TIMEOUT_SECONDS,
    EnvStep,
    ReadyCheck,
    RunStep,
    TemplateSpec,
    TemplateStep,
    UserStep,
    WorkdirStep,
)

IGNORED = frozenset({"EXPOSE", "LABEL", "MAINTAINER"})
UNSUPPORTED = frozenset({"ARG", "SHELL", "HEALTHCHECK", "VOLUME", "STOPSIGNAL", "ONBUILD"})
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")
_DIRECTIVE_RE = re.compile(r"^#\s*pandastack\s*:\s*(.*)$", re.IGNORECASE)
_PARSER_DIRECTIVE_RE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(.*?)\s*$")
_INSTRUCTION_RE = re.compile(r"^\s*([A-Za-z]+)(?:\s+(.*))?$", re.DOTALL)
_HEREDOC_RE = re.compile(r"<<-?\s*[\"']?[A-Za-z_]")

DirectiveHandler = Callable[[int, str], None]


def from_dockerfile(text: str, context_dir: Path | None = None) -> TemplateSpec:
    """Parse the Dockerfile subset; `context_dir` is where COPY sources are read from."""
    parser = _Parser(context_dir)
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
    def __init__(self, context_dir: Path | None) -> None:
        self.context = context_dir.absolute() if context_dir is not None else None
        self.from_template: str | None = None
        self.steps: list[TemplateStep] = []
        self.cmd: str | list[str] | None = None
        self.entrypoint: str | list[str] | None = None
        self.ready: tuple[str, str] | None = None
        self.ready_timeout = DEFAULT_READY_TIMEOUT_SECONDS
        self.budget = CopyBudget()

    def directive(self, lineno: int, text: str) -> None:
        words = text.split(None, 2)
        try:
            if len(words) == 3 and words[0].lower() == "ready":
                if words[1] not in ("port", "file", "command"):
                    raise ValueError(f"unknown ready check {words[1]!r}")
                self.ready = (words[1], words[2].strip())
                ReadyCheck(kind=words[1], value=self.ready[1])  # type: ignore[arg-type]
            elif len(words) == 2 and words[0].lower() == "ready-timeout":
                self.ready_timeout = float(words[1])
                ReadyCheck(kind="file", value="-", timeout_seconds=self.ready_timeout)
            else:
                raise ValueError("expected 'ready port|file|command <value>' or "
                                 "'ready-timeout <seconds>'")
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
        if self.from_template is None:
            raise ValueError("the first instruction must be FROM <template>")
        if name in IGNORED:
            return None
        if name in UNSUPPORTED:
            raise ValueError(f"{name} is not supported")
        handler = {"RUN": self._run, "COPY": self._copy, "ADD": self._add, "ENV": self._env,
                   "WORKDIR": self._workdir, "USER": self._user, "CMD": self._cmd,
                   "ENTRYPOINT": self._entrypoint}.get(name)
        if handler is None:
            raise ValueError(f"unknown instruction {name}")
        if not args:
            raise ValueError(f"{name} needs arguments")
        return handler(args)

    def _from(self, args: str) -> None:
        words = args.split()
        if self.from_template is not None:
            raise ValueError("multi-stage builds are not supported (a second FROM)")
        if words and words[0].startswith("--"):
            raise ValueError(f"FROM flags are not supported: {words[0]}")
        if len(words) == 3 and words[1].lower() == "as":
            raise ValueError("multi-stage builds are not supported (FROM ... AS)")
        if len(words) != 1:
            raise ValueError("FROM takes one template name or image reference")
        self.from_template = words[0]

    def _run(self, args: str) -> None:
        if args.startswith("--"):
            raise ValueError(f"RUN flags are not supported: {args.split()[0]}")
        if _HEREDOC_RE.match(args):
            raise ValueError("heredocs are not supported")
        argv = _json_list(args)
        self.steps.append(RunStep(command=argv if argv is not None else args))

    def _copy(self, args: str, instruction: str = "COPY") -> None:
        tokens = _json_list(args) or args.split()
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
            if "://" in src:
                raise ValueError(f"ADD from a URL is not supported: {src}")
            if src.lower().endswith(ARCHIVES):
                raise ValueError("ADD of an archive (which Docker unpacks) is not supported; "
                                 "COPY it and RUN tar")
        self._copy(args, "ADD")

    def _env(self, args: str) -> None:
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
                values[name] = value
        else:
            parts = args.split(None, 1)
            if len(parts) != 2:
                raise ValueError("ENV: expected NAME VALUE or NAME=VALUE ...")
            values[parts[0]] = parts[1]
        self.steps.append(EnvStep(env=values))

    def _workdir(self, args: str) -> None:
        self.steps.append(WorkdirStep(path=args))

    def _user(self, args: str) -> None:
        if ":" in args:
            raise ValueError("USER user:group is not supported; give a user name")
        self.steps.append(UserStep(name=args))

    def _cmd(self, args: str) -> None:
        self.cmd = _json_list(args) or args

    def _entrypoint(self, args: str) -> None:
        self.entrypoint = _json_list(args) or args

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
        return TemplateSpec(from_template=self.from_template, steps=self.steps,
                            start=self._start() or None, ready=ready)
