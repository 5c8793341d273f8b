"""`COPY --from=<stage>` of a multi-stage template build (ADR 0046's addendum): the paths
later stages need are packed by `tar` inside the stage's VM, streamed out through the agent
into a file of the build's own on the host (that VM is then removed), and streamed into the
VM of the stage that copies them, where `tar` unpacks and `cp -a` places them with COPY's
rules. Nothing of a stage is read or unpacked on the host: the archive only passes through.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import AsyncIterator
from pathlib import Path

from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.templates.steps import BuildState, Output, failure
from pandastack.hostport.errors import AgentError, BuildFailed
from pandastack.templatespec import CopyFromStep, StageSpec, TemplateSpec

#: The most one stage's copied paths may pack to (the archive is spooled on the host).
MAX_STAGE_ARCHIVE_BYTES = 4 * 2**30
GUEST_ARCHIVE = "/tmp/.pandastack-copy-from.tar"
CHUNK = 1 << 20

# $1: the archive; then the paths, relative to /. A missing one is named before tar runs.
_EXPORT = r'''out=$1; shift
for p; do
  if [ ! -e "/$p" ] && [ ! -L "/$p" ]; then
    echo "COPY --from: /$p: no such file or directory" >&2; exit 1
  fi
done
exec tar -cf "$out" -C / -- "$@"'''

# $1: the archive, $2: the destination, $3: 1 when dst is a directory for every source;
# then the sources, relative to /. Unpacked as root without the stage's owners (-o): COPY
# makes root's files, as Docker's does without --chown.
_IMPORT = r'''set -e
archive=$1; dst=$2; into=$3; shift 3
t=$(mktemp -d /tmp/.pandastack-copy-from.XXXXXX)
trap 'rm -rf "$t" "$archive"' EXIT
tar -xof "$archive" -C "$t"
for p; do
  if [ -d "$t/$p" ] && [ ! -L "$t/$p" ]; then
    mkdir -p -- "$dst"; cp -a -- "$t/$p/." "$dst/"
  elif [ "$into" = 1 ]; then
    mkdir -p -- "$dst"; cp -a -- "$t/$p" "$dst/"
  else
    mkdir -p -- "$(dirname -- "$dst")"; rm -rf -- "$dst"; cp -a -- "$t/$p" "$dst"
  fi
done'''


def stage_path(source: str) -> str:
    """A source as tar names it: relative to the stage's root (Docker reads `--from`
    sources from there, not from its WORKDIR), never above it."""
    return posixpath.normpath("/" + source).lstrip("/") or "."


def stage_sources(spec: TemplateSpec) -> dict[int, list[str]]:
    """Every path each earlier stage must hand over, over every later stage's copies."""
    found: dict[int, set[str]] = {}
    for steps in [*(stage.steps for stage in spec.stages), spec.steps]:
        for step in steps:
            if isinstance(step, CopyFromStep):
                found.setdefault(step.stage, set()).update(stage_path(s) for s in step.sources)
    return {index: sorted(paths) for index, paths in found.items()}


def stage_title(index: int, stage: StageSpec) -> str:
    return f"stage {index}" + (f" ({stage.name})" if stage.name else "")


async def export_stage(sandbox: SandboxHandle, sources: list[str], archive: Path, *,
                       title: str, timeout: float) -> int:
    """Pack `sources` in the stage's VM and stream them into `archive`; its size."""
    out = Output(lambda _line: None)
    try:
        result = await sandbox.exec(["sh", "-c", _EXPORT, "sh", GUEST_ARCHIVE, *sources],
                                    timeout=timeout, on_stderr=out.stderr)
    except AgentError as exc:
        raise BuildFailed(f"{title}: packing its files failed: {exc}",
                          instruction=f"COPY --from {title}") from exc
    out.flush()
    if result.exit_code != 0 or result.timed_out:
        raise BuildFailed(f"{title}: packing its files failed: {out.text()}",
                          instruction=f"COPY --from {title}", exit_code=result.exit_code,
                          output=out.text())
    size = 0
    with archive.open("wb") as f:
        async with contextlib.aclosing(sandbox.read_file(GUEST_ARCHIVE)) as chunks:
            async for chunk in chunks:
                size += len(chunk)
                if size > MAX_STAGE_ARCHIVE_BYTES:
                    raise BuildFailed(f"{title}: the files copied from it exceed "
                                      f"{MAX_STAGE_ARCHIVE_BYTES // 2**30} GiB",
                                      instruction=f"COPY --from {title}")
                f.write(chunk)
    return size


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


async def import_stage(sandbox: SandboxHandle, step: CopyFromStep, archive: Path,
                       state: BuildState, *, number: int, total: int, title: str,
                       timeout: float, out: Output) -> None:
    """Place `step`'s sources from the stage's `archive` into the build's VM."""
    into = "1" if step.dst.endswith("/") or len(step.sources) > 1 else "0"
    argv = ["sh", "-c", _IMPORT, "sh", GUEST_ARCHIVE, state.path(step.dst), into,
            *(stage_path(s) for s in step.sources)]
    try:
        await sandbox.write_file(GUEST_ARCHIVE, _file_chunks(archive), mode=0o600)
        result = await sandbox.exec(argv, timeout=timeout, on_stdout=out.stdout,
                                    on_stderr=out.stderr)
    except AgentError as exc:
        out.flush()
        raise failure(number, total, title, f"failed: {exc}", out) from exc
    out.flush()
    if result.timed_out:
        raise failure(number, total, title, f"timed out after {timeout:g}s", out)
    if result.exit_code != 0:
        raise failure(number, total, title, f"failed with exit code {result.exit_code}", out,
                      result.exit_code)
