"""Built-in templates: `python` (the base image under its own name), `node` (base plus
Debian's nodejs and npm, its own image variant) and `full` (every language). Real VMs; the node
image is built on first use (mmdebstrap downloads ~40 MB of packages once) and cached under
PANDASTACK_HOME like the base; so is full's (Debian's toolchains and Bun from npm)."""

from __future__ import annotations

import shlex

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


def _write(path: str, *lines: str) -> str:
    """A shell command that writes `lines` to `path` as they are (printf's %s reads no
    escapes or % in them)."""
    return f"printf '%s\\n' {' '.join(shlex.quote(line) for line in lines)} > {path}"


GO_PROGRAM = ("package main", 'import "fmt"', "func main() { fmt.Println(6 * 7) }")
C_PROGRAM = ("#include <stdio.h>", 'int main(void) { printf("%d\\n", 6 * 7); return 0; }')
# Each language once, as a sandbox's first use of it: every one must print 42.
LANGUAGES = {
    "python": "python -c 'print(6*7)'",
    "node": "node -e 'console.log(6*7)'",
    "bun": "bun -e 'console.log(6*7)'",
    "go run": f"cd \"$(mktemp -d)\" && {_write('main.go', *GO_PROGRAM)} && go run main.go",
    "gcc": f"cd \"$(mktemp -d)\" && {_write('main.c', *C_PROGRAM)} && gcc -o main main.c && ./main",
}


# The one test that builds `full` (issue 37): `make test`'s setup step builds it ahead
# (`pandastack setup --template full`, ~130 s cold on 2 TCG cores, cached by content), so in
# the lane it costs its create and the five first uses (~14 s).
@pytest.mark.timeout(3600)
async def test_full_template_runs_every_language(runtime: HostRuntime,
                                                 sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory(template="full")
    for language, cmd in LANGUAGES.items():
        result = await sbx.exec(cmd, timeout=300)
        assert (result.exit_code, result.stdout) == (0, b"42\n"), (language, result)
    tools = await sbx.exec("git --version && curl --version && make --version", timeout=60)
    assert tools.exit_code == 0, tools
    # The bake's go build filled the build cache on the template's disk: a sandbox's first
    # go build starts from it (each language was run once before the snapshot).
    cache = await sbx.exec("find /root/.cache/go-build -type f | wc -l", timeout=60)
    assert cache.exit_code == 0 and int(cache.stdout) > 0, cache
    full = await runtime.ensure_template("full")
    node = await runtime.ensure_template("node")
    assert full.path != node.path and full.key != node.key


async def test_unknown_template_is_template_not_found(runtime: HostRuntime) -> None:
    before = {h.id for h in runtime.list()}
    sid = "sbx-00000000dead"
    with pytest.raises(TemplateNotFound):
        await runtime.create("no-such-template", sandbox_id=sid)
    assert {h.id for h in runtime.list()} == before
    assert not (runtime.sandboxes_dir / sid).exists()
