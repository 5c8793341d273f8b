"""Wire models of a template spec: a base template, ordered build steps, a start command and a
ready check. Everything a client sends is validated here, before any VM is involved: package
names against safe patterns, no NUL bytes anywhere, bounded counts and sizes.

Paths in steps are guest paths. A relative one (COPY destination, WORKDIR) is resolved when the
build applies it, against the working directory at that point (`DEFAULT_WORKDIR` before any
WORKDIR step, the directory every sandbox exec starts in).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pandastack.rules import MAX_TEMPLATE_STAGES
from pandastack.wire.base import Strict

from .base import base_kind
from .ports import MAX_EXPOSED_PORTS, exposed_port, unique

MAX_STEPS = 64  # every step that changes the guest adds a disk layer to the template's chain
MAX_PACKAGES = 256
MAX_COMMAND_CHARS = 64 * 1024
MAX_PATH_CHARS = 4096
MAX_COPY_BYTES = 64 * 2**20  # decoded bytes of every copied file of one spec together
MAX_COPY_FILES = 10_000
MAX_ENV_ITEMS = 256
MAX_READY_TIMEOUT_SECONDS = 3600.0
DEFAULT_READY_TIMEOUT_SECONDS = 120.0
DEFAULT_WORKDIR = "/work"

# Debian package names, optionally with `=version` or `:arch`.
APT_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:-]+)?$")
# A PEP 508 name with optional extras and version specifiers (no URLs, no markers, no
# spaces), or an absolute guest path to a wheel or sdist the build put there.
PIP_PACKAGE_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?"
    r"(?:(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+"
    r"(?:,(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+)*)?"
    r"|/[A-Za-z0-9._+/-]+)$")
# An npm name (optionally scoped) with an optional version or range after `@`.
NPM_PACKAGE_RE = re.compile(
    r"^(?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*(?:@[A-Za-z0-9.^~<>=*|+_-]+)?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
USER_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# A uid or gid as Docker takes one: decimal, no sign or leading zeros (one spelling per id,
# so one step cache key), at most MAX_ID (2**31-1 is the kernel's "no id" in 32-bit APIs).
ID_RE = re.compile(r"^(?:0|[1-9][0-9]{0,9})$")
MAX_ID = 2**31 - 2
MAX_USER_CHARS = 64  # a template's user is kept in a 64-character column (server/store)
# A built-in template name, or `snapshot:<id>` (a user template version).
# A template name, snapshot:<id>, or an OCI image reference (templatespec/base.py says which;
# the host parses an image reference strictly: images/oci/reference.py).
FROM_RE = re.compile(r"^(?:snapshot:[A-Za-z0-9._-]{1,64}|[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
                     r"|[A-Za-z0-9\[][A-Za-z0-9._:/@\[\]-]{0,127})$")


def _no_nul(value: str, what: str) -> str:
    if "\0" in value:
        raise ValueError(f"{what} must not contain NUL bytes")
    return value


def _packages(values: list[str], pattern: re.Pattern[str], what: str) -> list[str]:
    if not values:
        raise ValueError(f"{what} needs at least one package")
    for value in values:
        if not pattern.match(value) or len(value) > 256:
            raise ValueError(f"invalid {what} package name {value!r}")
    return values


def _guest_path(value: str, what: str) -> str:
    _no_nul(value, what)
    if not value or len(value) > MAX_PATH_CHARS:
        raise ValueError(f"{what} must be 1 to {MAX_PATH_CHARS} characters")
    return value


# A step's package list: 1 to MAX_PACKAGES names, each matching the manager's pattern.
AptPackages = Annotated[list[str], Field(max_length=MAX_PACKAGES),
                        AfterValidator(lambda v: _packages(v, APT_PACKAGE_RE, "apt"))]
PipPackages = Annotated[list[str], Field(max_length=MAX_PACKAGES),
                        AfterValidator(lambda v: _packages(v, PIP_PACKAGE_RE, "pip"))]
NpmPackages = Annotated[list[str], Field(max_length=MAX_PACKAGES),
                        AfterValidator(lambda v: _packages(v, NPM_PACKAGE_RE, "npm"))]


class AptStep(Strict):
    """`apt-get install` of Debian packages (always as root: the package manager needs it)."""

    kind: Literal["apt"] = "apt"
    packages: AptPackages


class PipStep(Strict):
    """`pip install` into the guest's virtualenv (first on PATH)."""

    kind: Literal["pip"] = "pip"
    packages: PipPackages


class NpmStep(Strict):
    """`npm install -g` (needs a base with node, e.g. the `node` template)."""

    kind: Literal["npm"] = "npm"
    packages: NpmPackages


class RunStep(Strict):
    """A shell command (`sh -c`), or an argv list (run without a shell)."""

    kind: Literal["run"] = "run"
    command: str | list[str]

    @field_validator("command")
    @classmethod
    def _check(cls, v: str | list[str]) -> str | list[str]:
        parts = [v] if isinstance(v, str) else v
        if not parts or not parts[0].strip():
            raise ValueError("run needs a non-empty command")
        if sum(len(p) for p in parts) > MAX_COMMAND_CHARS:
            raise ValueError(f"run command is longer than {MAX_COMMAND_CHARS} characters")
        for part in parts:
            _no_nul(part, "run command")
        return v


class CopyFile(Strict):
    """One file of a copy step: `path` is relative to the step's `dst`."""

    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    mode: int = Field(default=0o644, ge=0, le=0o777)
    content_b64: str = Field(max_length=(MAX_COPY_BYTES // 3 + 1) * 4)

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        _no_nul(v, "copy path")
        parts = v.split("/")
        if v.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"copy path {v!r} must be relative, without '.', '..' or '//'")
        return v

    @field_validator("content_b64")
    @classmethod
    def _base64(cls, v: str) -> str:
        try:
            base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("content_b64 is not valid base64") from exc
        return v

    @property
    def size(self) -> int:
        """Decoded size, without decoding."""
        return len(self.content_b64) * 3 // 4 - self.content_b64[-2:].count("=")

    def content(self) -> bytes:
        return base64.b64decode(self.content_b64)


class CopyStep(Strict):
    """Files written under `dst` (a directory; created with its parents)."""

    kind: Literal["copy"] = "copy"
    dst: str
    files: list[CopyFile] = Field(max_length=MAX_COPY_FILES)

    @field_validator("dst")
    @classmethod
    def _dst(cls, v: str) -> str:
        return _guest_path(v, "copy dst")


class CopyFromStep(Strict):
    """`COPY --from=<stage>`: paths of an earlier stage's guest (relative ones from its root,
    as Docker reads them) copied to `dst`, resolved like a copy step's. A directory's
    contents go under `dst`; a single file goes to `dst` itself unless `dst` ends with `/`;
    several sources need a `dst` ending with `/`. The copies are owned by root."""

    kind: Literal["copy_from"] = "copy_from"
    stage: int = Field(ge=0, lt=MAX_TEMPLATE_STAGES - 1)
    sources: list[str] = Field(min_length=1, max_length=MAX_PACKAGES)
    dst: str

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        for src in v:
            _guest_path(src, "copy --from source")
            if any(c in src for c in "*?["):
                raise ValueError(f"copy --from source {src!r}: wildcards are not supported")
        return v

    @field_validator("dst")
    @classmethod
    def _dst(cls, v: str) -> str:
        return _guest_path(v, "copy dst")

    @model_validator(mode="after")
    def _many(self) -> CopyFromStep:
        if len(self.sources) > 1 and not self.dst.endswith("/"):
            raise ValueError("copying several sources needs a destination ending with '/': "
                             f"{self.dst}")
        return self


class EnvStep(Strict):
    """Variables for every later step and for the start command. A value may name earlier
    variables as `$NAME`, `${NAME}`, `${NAME:-default}` or `${NAME:+alt}` (`\\$` is a literal
    dollar); they are expanded when the build reaches the step, against the guest's default
    environment plus earlier ENV steps."""

    kind: Literal["env"] = "env"
    env: dict[str, str] = Field(min_length=1, max_length=MAX_ENV_ITEMS)

    @field_validator("env")
    @classmethod
    def _check(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not ENV_NAME_RE.match(name) or len(name) > 256:
                raise ValueError(f"invalid environment variable name {name!r}")
            _no_nul(value, f"value of {name}")
            if len(value) > MAX_COMMAND_CHARS:
                raise ValueError(f"value of {name} is too long")
        return v


class WorkdirStep(Strict):
    """The directory later steps (and the start command) run in; created if missing."""

    kind: Literal["workdir"] = "workdir"
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return _guest_path(v, "workdir")


def _user_part(part: str) -> bool:
    if ID_RE.fullmatch(part):
        return int(part) <= MAX_ID
    return bool(USER_NAME_RE.fullmatch(part))


def check_user_spec(v: str) -> str:
    """Docker's USER forms: `name`, `uid`, `name:group`, `uid:gid`, `name:gid`, `uid:group`
    (sdk-ts/src/template.ts checks the same)."""
    parts = v.split(":")
    if len(v) > MAX_USER_CHARS or len(parts) > 2 or not all(_user_part(p) for p in parts):
        raise ValueError(f"invalid user {v!r}: a user name or uid (0 to {MAX_ID}), "
                         "optionally :group name or :gid")
    return v


class UserStep(Strict):
    """The user later run/pip/npm steps and the start command run as (`root` resets), in
    Docker's forms: a name or uid, optionally `:group` or `:gid`. A uid the guest's
    /etc/passwd lacks runs as that bare uid (HOME=/, gid 0 unless given), as in Docker; a
    group name must be in its /etc/group."""

    kind: Literal["user"] = "user"
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_user_spec(v)


TemplateStep = Annotated[
    AptStep | PipStep | NpmStep | RunStep | CopyStep | CopyFromStep | EnvStep | WorkdirStep
    | UserStep,
    Field(discriminator="kind"),
]
# Steps that only change what later steps run with: nothing happens inside the guest.
HOST_ONLY_STEPS = (EnvStep, UserStep)


class ReadyCheck(Strict):
    """When the started server counts as ready: `port` accepts a TCP connection on
    127.0.0.1, `file` exists, or `command` exits 0. Polled until `timeout_seconds`."""

    kind: Literal["port", "file", "command"]
    value: str = Field(min_length=1, max_length=MAX_COMMAND_CHARS)
    timeout_seconds: float = Field(default=DEFAULT_READY_TIMEOUT_SECONDS, gt=0,
                                   le=MAX_READY_TIMEOUT_SECONDS)

    @field_validator("value", mode="before")
    @classmethod
    def _port_as_text(cls, v: object) -> object:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _check(self) -> ReadyCheck:
        _no_nul(self.value, "ready value")
        if self.kind == "port" and not (self.value.isdigit() and 1 <= int(self.value) <= 65535):
            raise ValueError(f"ready port must be 1-65535, not {self.value!r}")
        return self

    @property
    def port(self) -> int:
        return int(self.value)


def _base_name(v: str) -> str:
    if not FROM_RE.match(v):
        raise ValueError(f"invalid base template {v!r}: a template name, snapshot:<id> "
                         "or an image reference")
    return v


class StageSpec(Strict):
    """An earlier stage of a multi-stage build: built in a VM of its own from its base, its
    steps run there, then the paths later stages copy from it are taken out and the VM is
    removed. Only the spec's own (last) stage becomes the template."""

    name: str | None = Field(default=None, max_length=128)
    from_template: str = Field(max_length=128)
    steps: list[TemplateStep] = Field(default_factory=list, max_length=MAX_STEPS)

    @field_validator("from_template")
    @classmethod
    def _from(cls, v: str) -> str:
        return _base_name(v)


class TemplateSpec(Strict):
    from_template: str = Field(default="base", max_length=128)
    steps: list[TemplateStep] = Field(default_factory=list, max_length=MAX_STEPS)
    start: str | None = Field(default=None, min_length=1, max_length=MAX_COMMAND_CHARS)
    ready: ReadyCheck | None = None
    #: Start the image's own Entrypoint and Cmd (a spec FROM an OCI image) instead of `start`
    #: (None: no; optional rather than false by default, so the TypeScript type has it so).
    start_from_image: bool | None = None
    #: Earlier stages, in order; `copy_from` steps name them by index (a stage only earlier
    #: ones). Empty: a one-stage build.
    stages: list[StageSpec] = Field(default_factory=list, max_length=MAX_TEMPLATE_STAGES - 1)
    # Left out of the JSON while empty: agents of the release before EXPOSE was read refuse a
    # spec with a field they do not know, so during a rolling upgrade (hostport/compat.py)
    # only a build with EXPOSE needs an upgraded agent.
    exposed_ports: list[str] = Field(
        default_factory=list, max_length=MAX_EXPOSED_PORTS, exclude_if=lambda ports: not ports,
        description="the template's own exposed ports (a Dockerfile's EXPOSE) in Docker's "
                    "form, \"8080/tcp\" (\"8080\" is read so), each once; listed with its "
                    "image's ExposedPorts in the template's info; nothing is published by them")

    @field_validator("from_template")
    @classmethod
    def _from(cls, v: str) -> str:
        return _base_name(v)

    @field_validator("exposed_ports")
    @classmethod
    def _ports(cls, v: list[str]) -> list[str]:
        return unique(exposed_port(port) for port in v)

    @model_validator(mode="after")
    def _bounds(self) -> TemplateSpec:
        if self.start is not None:
            _no_nul(self.start, "start command")
        if self.start_from_image:
            if self.start is not None:
                raise ValueError("a start command or the image's (start from image), not both")
            if base_kind(self.from_template) != "image":
                raise ValueError("start from image needs FROM an image, not the template "
                                 f"{self.from_template!r}")
        if self.ready is not None and self.start is None and not self.start_from_image:
            raise ValueError("a ready check needs a start command")
        every = [*(s for stage in self.stages for s in stage.steps), *self.steps]
        for index, steps in enumerate([*(stage.steps for stage in self.stages), self.steps]):
            for step in steps:
                if isinstance(step, CopyFromStep) and step.stage >= index:
                    raise ValueError(f"copy --from stage {step.stage}: a stage copies only "
                                     "from an earlier one")
        files = [f for s in every if isinstance(s, CopyStep) for f in s.files]
        if len(files) > MAX_COPY_FILES:
            raise ValueError(f"more than {MAX_COPY_FILES} copied files")
        if sum(f.size for f in files) > MAX_COPY_BYTES:
            raise ValueError(f"copied files exceed {MAX_COPY_BYTES // 2**20} MiB together")
        return self


def step_key(parent_key: str, step: TemplateStep) -> str:
    """The cache key of the state after `step`: a hash of its parent's key and the step's
    canonical JSON (copied files' contents and modes included)."""
    canonical = json.dumps(step.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(f"{parent_key}\n{canonical}".encode()).hexdigest()


def describe_step(step: TemplateStep, limit: int = 200) -> str:
    """One line naming the step the way a Dockerfile would (logs, error messages)."""
    match step:
        case AptStep(packages=pkgs):
            text = "APT " + " ".join(pkgs)
        case PipStep(packages=pkgs):
            text = "PIP " + " ".join(pkgs)
        case NpmStep(packages=pkgs):
            text = "NPM " + " ".join(pkgs)
        case RunStep(command=cmd):
            text = "RUN " + (cmd if isinstance(cmd, str) else json.dumps(cmd))
        case CopyStep(dst=dst, files=files):
            text = f"COPY {len(files)} file{'s' if len(files) != 1 else ''} to {dst}"
        case CopyFromStep(stage=stage, sources=sources, dst=dst):
            text = f"COPY --from={stage} {' '.join(sources)} {dst}"
        case EnvStep(env=env):
            text = "ENV " + " ".join(f"{k}={v}" for k, v in env.items())
        case WorkdirStep(path=path):
            text = f"WORKDIR {path}"
        case UserStep(name=name):
            text = f"USER {name}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


_VAR_RE = re.compile(r"\\\$|\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)"
                     r"(?::([-+])([^}]*))?\})")


def substitute_refs(text: str, value_of: Callable[[str], str | None], *,
                    unescape: bool) -> str:
    """Docker's substitution of `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}` by
    `value_of(NAME)` (None: the reference is left as written); `\\$` becomes `$` with
    `unescape`, else it stays for a later substitution."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name is None:  # an escaped `\$`
            return "$" if unescape else m.group(0)
        current = value_of(name)
        if current is None:
            return m.group(0)
        if m.group(3) == "-":
            return current or m.group(4)
        if m.group(3) == "+":
            return m.group(4) if current else ""
        return current

    return _VAR_RE.sub(sub, text)


def expand_env(value: str, env: dict[str, str]) -> str:
    """Docker's ENV substitution: `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME:+alt}`;
    unknown names expand to nothing; `\\$` is a literal `$`."""
    return substitute_refs(value, lambda name: env.get(name, ""), unescape=True)
