"""Built-in templates: `python` (the base image under its own name) and `node` (base plus
Debian's nodejs and npm, its own image variant). Real VMs; the node image is built on first use
(mmdebstrap downloads ~40 MB of packages once) and cached under PANDASTACK_HOME like the base."""

from __future__ import annotations

import pytest

from pandastack.host.runtime import HostRuntime
from pandastack.hostport.errors import TemplateNotFound
from tests.helpers import SandboxFactory

pytestmark = pytest.mark.vm


async def test_python_template_runs_python(runtime: HostRuntime,
                                           sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory(template="python")
    result = await sbx.exec("python -c 'print(6*7)'", timeout=60)
    assert (result.exit_code, result.stdout, result.stderr) == (0, b"42\n", b"")
    assert sbx.template == "python"
    # Same image, same warm-up as `base`: it restores base's snapshot instead of baking a copy.
    python = await runtime.ensure_template("python")
    assert python.name == "python"
    assert python.path == (await runtime.ensure_template("base")).path


# `make test` builds the node template before its lanes (8 s here then); run alone on a cold
# cache, this test builds the node image (mmdebstrap, 145-300 s) and bakes its template.
@pytest.mark.timeout(1800)
async def test_node_template_runs_node(runtime: HostRuntime,
                                       sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory(template="node")
    result = await sbx.exec("node -e 'console.log(6*7)'", timeout=60)
    assert (result.exit_code, result.stdout, result.stderr) == (0, b"42\n", b"")
    # Starting npm takes ~10 s under TCG: that it is installed is enough here.
    npm = await sbx.exec("test -x /usr/bin/npm && test -d /usr/share/nodejs/npm", timeout=60)
    assert npm.exit_code == 0, npm.stderr
    tmpl = await runtime.ensure_template("node")
    base = await runtime.ensure_template("base")
    assert tmpl.path != base.path and tmpl.key != base.key
    # The code interpreter runs JavaScript here, with state kept between calls.
    first = [e async for e in sbx.run_code("let n = 6 * 7; n", language="javascript")]
    assert [(e.type, e.data) for e in first if e.type == "result"] == [
        ("result", {"text/plain": "42"})], first
    again = [e async for e in sbx.run_code("console.log(n + 1)", language="javascript")]
    assert "".join(e.text for e in again if e.type == "stdout") == "43\n", again


async def test_unknown_template_is_template_not_found(runtime: HostRuntime) -> None:
    before = {h.id for h in runtime.list()}
    sid = "sbx-00000000dead"
    with pytest.raises(TemplateNotFound):
        await runtime.create("no-such-template", sandbox_id=sid)
    assert {h.id for h in runtime.list()} == before
    assert not (runtime.sandboxes_dir / sid).exists()
