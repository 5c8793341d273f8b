"""A multi-stage Dockerfile with ARG built on real VMs (issue 37 part 3): the first stage
makes a tool and runs it, the last stage copies only the tool's output; a sandbox of the
template has the copied files (with the build arg's value in their content and name) and
not the first stage's tool. Nothing of the first stage is left: no VM, no archive on the
host, no snapshot but the step cache's. A rebuild is cached through and boots no stage."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.host.templates.builds import STAGES_DIR, TemplateBuilds
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.results import BuildResult
from pandastack.templatespec import from_dockerfile
from tests.helpers import SandboxFactory

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

DOCKERFILE = r"""
ARG VERSION=1
FROM base AS build
ARG VERSION
RUN printf '#!/bin/sh\necho "made by stage-tool $1"\n' > /usr/local/bin/stage-tool && \
    chmod 755 /usr/local/bin/stage-tool
RUN mkdir -p /out/lib && stage-tool "$VERSION" > /out/lib/artifact && echo extra > /out/other
FROM base
ARG VERSION
COPY --from=build /out/lib /opt/app/
COPY --from=build /out/other /usr/local/share/other-${VERSION}
"""


@pytest.fixture
async def builds(runtime: HostRuntime, tmp_path: Path) -> AsyncIterator[TemplateBuilds]:
    before = {h.id for h in runtime.list()}
    builds = TemplateBuilds(runtime, tmp_path / "builds")
    yield builds
    builds.prune_cache()
    shutil.rmtree(tmp_path / "builds", ignore_errors=True)
    assert {h.id for h in runtime.list()} == before, "a build sandbox was left behind"


async def test_two_stages_with_a_build_arg(builds: TemplateBuilds, runtime: HostRuntime,
                                           sandbox_factory: SandboxFactory) -> None:
    spec = from_dockerfile(DOCKERFILE, build_args={"VERSION": "2"})
    assert len(spec.stages) == 1
    snapshots_before = {s.id for s in runtime.snapshots.all(include_internal=True)}
    sandboxes_before = {h.id for h in runtime.list()}
    lines: list[str] = []
    results: list[BuildResult] = []
    try:
        results.append(await builds.build(spec, log=lines.append,
                                          network=NetworkPolicy(internet=False)))
        result = results[0]
        assert "== stage 0 (build): FROM base" in lines, lines
        # Nothing of the first stage is left: its VM, its archive; its snapshots are the
        # step cache's (pruned by the fixture), and the template's.
        assert {h.id for h in runtime.list()} == sandboxes_before
        assert not any((builds.cache.root / STAGES_DIR).glob("*/*"))
        made = {s.id for s in runtime.snapshots.all(include_internal=True)} - snapshots_before
        cached = {e.snapshot_id for e in builds.cache_entries()}
        assert made == cached | {result.snapshot_id}

        sbx = await sandbox_factory(snapshot=result.snapshot_id)
        probe = await sbx.exec("cat /opt/app/artifact /usr/local/share/other-2; "
                               "stat -c %U /opt/app/artifact", timeout=60)
        assert probe.exit_code == 0, probe
        assert probe.stdout == b"made by stage-tool 2\nextra\nroot\n", probe
        tool = await sbx.exec("command -v stage-tool || ls /out", timeout=60)
        assert tool.exit_code != 0, tool  # the first stage's tool and tree stayed there

        lines.clear()
        results.append(await builds.build(spec, log=lines.append,
                                          network=NetworkPolicy(internet=False)))
        assert results[1].steps_cached == results[1].steps_total == 2
        assert not any(line.startswith("== stage") for line in lines), lines
    finally:
        for done in results:
            runtime.delete_snapshot(done.snapshot_id)
