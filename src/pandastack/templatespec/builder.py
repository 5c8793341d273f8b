"""The Python builder of a template spec, and the reading of local files into copy steps
(shared with the Dockerfile parser).

    spec = (Template("base")
            .pip_install("requests==2.32.3")
            .copy("./app", "/srv/app/")
            .workdir("/srv/app")
            .start("python -m http.server 8000", ready=wait_for_port(8000))
            .to_spec())

Every method validates its step at once (a bad package name fails where it is written) and
`copy` reads the local files when it is called: later changes to them do not reach the spec.
"""

from __future__ import annotations

import base64
import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pandastack.rules import DEFAULT_TEMPLATE

from .models import (
    DEFAULT_READY_TIMEOUT_SECONDS,
    MAX_COPY_BYTES,
    MAX_COPY_FILES,
    AptStep,
    CopyFile,
    CopyStep,
    EnvStep,
    NpmStep,
    PipStep,
    ReadyCheck,
    RunStep,
    TemplateSpec,
    TemplateStep,
    UserStep,
    WorkdirStep,
)
from .ports import expose_ports, unique


def wait_for_port(port: int, timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS) -> ReadyCheck:
    """Ready once something accepts TCP connections on 127.0.0.1:`port` in the guest."""
    return ReadyCheck(kind="port", value=str(port), timeout_seconds=timeout_seconds)


def wait_for_file(path: str, timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS) -> ReadyCheck:
    """Ready once `path` exists in the guest (relative: to the working directory)."""
    return ReadyCheck(kind="file", value=path, timeout_seconds=timeout_seconds)


def wait_for_command(command: str,
                     timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS) -> ReadyCheck:
    """Ready once `command` (run with `sh -c`, as the template's user) exits 0."""
    return ReadyCheck(kind="command", value=command, timeout_seconds=timeout_seconds)


@dataclass
class CopyBudget:
    """What one spec may still copy: checked while reading, so that a huge tree fails early
    instead of being read into memory first."""

    bytes_left: int = MAX_COPY_BYTES
    files_left: int = MAX_COPY_FILES

    def take(self, size: int, where: Path) -> None:
        self.bytes_left -= size
        self.files_left -= 1
        if self.bytes_left < 0:
            raise ValueError(f"copied files exceed {MAX_COPY_BYTES // 2**20} MiB together "
                             f"(at {where})")
        if self.files_left < 0:
            raise ValueError(f"more than {MAX_COPY_FILES} copied files (at {where})")


def copy_step(sources: Sequence[Path], dst: str, *, root: Path | None = None,
              budget: CopyBudget | None = None) -> CopyStep:
    """Read `sources` into one copy step, with Dockerfile COPY semantics: a directory's
    contents go under `dst`; a single file goes to `dst` itself unless `dst` ends with `/`
    (or is `.`); several sources need a `dst` ending with `/`. With `root`, every source and
    every symlink met must resolve inside it (a build context)."""
    budget = budget if budget is not None else CopyBudget()
    if not sources:
        raise ValueError("copy needs a source")
    many = len(sources) > 1
    if many and not dst.endswith("/"):
        raise ValueError(f"copying several sources needs a destination ending with '/': {dst}")
    files: dict[str, CopyFile] = {}
    target_dir = dst
    into_dir = many or dst.endswith("/") or posixpath.basename(dst) in (".", "..")
    for src in sources:
        real = _resolve(src, root)
        if real.is_dir():
            for rel, path in _walk(real, root):
                files[rel] = _read(path, rel, budget)
        elif real.is_file():
            if into_dir:
                files[src.name] = _read(real, src.name, budget)
            else:
                head, name = posixpath.split(dst)
                target_dir = head or "."
                files[name] = _read(real, name, budget)
        else:
            raise ValueError(f"{src} is not a regular file or directory")
    return CopyStep(dst=target_dir, files=[files[k] for k in sorted(files)])


def _resolve(path: Path, root: Path | None) -> Path:
    # Lexically first: a path outside the context is refused without looking at it (its
    # existence is none of the Dockerfile's business).
    if root is not None and not Path(os.path.normpath(path)).is_relative_to(
            os.path.normpath(root)):
        raise ValueError(f"{path} is outside the build context {root}")
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if root is not None and not real.is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside the build context {root}")
    return real


def _walk(directory: Path, root: Path | None) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():
                raise ValueError(f"{Path(dirpath) / name}: symlinked directories are not "
                                 "supported in a copy")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            real = _resolve(path, root) if path.is_symlink() else path
            rel = path.relative_to(directory).as_posix()
            found.append((rel, real))
    return found


def _read(path: Path, rel: str, budget: CopyBudget) -> CopyFile:
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} is not a regular file")
    budget.take(st.st_size, path)
    with path.open("rb") as f:
        data = f.read(st.st_size + 1)  # a file that grew since stat must not slip past
    if len(data) != st.st_size:
        raise ValueError(f"{path} changed while it was read")
    return CopyFile(path=rel, mode=st.st_mode & 0o777,
                    content_b64=base64.b64encode(data).decode())


class Template:
    """Builds a `TemplateSpec` step by step; every method returns the builder."""

    def __init__(self, from_template: str = DEFAULT_TEMPLATE) -> None:
        self._from = from_template
        self._steps: list[TemplateStep] = []
        self._start: str | None = None
        self._start_from_image = False
        self._ready: ReadyCheck | None = None
        self._exposed: list[str] = []
        self._budget = CopyBudget()

    def _add(self, step: TemplateStep) -> Template:
        self._steps.append(step)
        return self

    def apt_install(self, *packages: str) -> Template:
        return self._add(AptStep(packages=list(packages)))

    def pip_install(self, *packages: str) -> Template:
        return self._add(PipStep(packages=list(packages)))

    def npm_install(self, *packages: str) -> Template:
        return self._add(NpmStep(packages=list(packages)))

    def run(self, command: str | Sequence[str]) -> Template:
        return self._add(RunStep(command=command if isinstance(command, str) else list(command)))

    def copy(self, src: str | os.PathLike[str], dst: str) -> Template:
        """Copy a local file or directory (its contents) to `dst` in the guest, read now."""
        return self._add(copy_step([Path(src)], dst, budget=self._budget))

    def env(self, values: Mapping[str, str] | None = None, /, **kv: str) -> Template:
        return self._add(EnvStep(env={**(values or {}), **kv}))

    def workdir(self, path: str) -> Template:
        return self._add(WorkdirStep(path=path))

    def user(self, name: str) -> Template:
        """Who later steps and the start command run as: `name`, `uid`, `name:group`,
        `uid:gid` (and the mixed forms), as a Dockerfile's USER."""
        return self._add(UserStep(name=name))

    def start(self, command: str, ready: ReadyCheck | None = None) -> Template:
        """The command started (in the background) at the end of the build, before the
        template is saved: every sandbox made from the template has it running already."""
        self._start, self._ready, self._start_from_image = command, ready, False
        return self

    def start_image(self, ready: ReadyCheck | None = None) -> Template:
        """Like `start`, with the image's own Entrypoint and Cmd (a template FROM an image)."""
        self._start, self._ready, self._start_from_image = None, ready, True
        return self

    def expose(self, *ports: int | str) -> Template:
        """Ports the template declares, as a Dockerfile's EXPOSE does (8080, "53/udp",
        "8000-8010"): listed in its info with its image's, published by nothing."""
        for port in ports:
            self._exposed += expose_ports(port)
        return self

    def to_spec(self) -> TemplateSpec:
        return TemplateSpec(from_template=self._from, steps=list(self._steps),
                            start=self._start, ready=self._ready,
                            start_from_image=self._start_from_image or None,
                            exposed_ports=unique(self._exposed))
