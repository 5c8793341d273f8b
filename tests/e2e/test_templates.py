"""Team templates through a live server: build from a Dockerfile (SDK and CLI), follow the
log, create sandboxes from the name, versions, failure, delete. The build unpacks a wheel
made here into the guest's virtualenv (no package index: test guests have no internet).

The RUN step unpacks the wheel with one `python -c` rather than `pip install`: pip's start
in a TCG guest took 19 s of this test's build at load 5 (its import, before it reads the
wheel). A RUN of `pip install` in a build, its output logged and its package importable from
the template, is tests/host/templates/test_builds.py's (the builder spec and the cached
prefix, both in make test), and pip in a sandbox's virtualenv tests/host/runtime/
test_runtime_exec.py's; what this test adds is the server's part: upload, log, versions."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack import Client, ConflictError, NotFoundError, Sandbox
from pandastack.sdk.errors import QuotaExceededError, TemplateBuildError
from pandastack.server.sandboxes.templates import BUILD_RESERVE_BYTES
from tests.e2e.conftest import LiveServer
from tests.e2e.forked_cli import ForkedCLI
from tests.helpers import make_wheel

pytestmark = [pytest.mark.e2e, pytest.mark.vm, pytest.mark.timeout(1500)]


UNPACK = ("python -c \"import site, zipfile; "
          "zipfile.ZipFile('/tmp/{wheel}').extractall(site.getsitepackages()[0])\"")
DOCKERFILE = """\
FROM base
# pandastack: ready port 8000
COPY {wheel} /tmp/{wheel}
RUN """ + UNPACK + """
ENV GREETING=hello
WORKDIR /srv
RUN echo "$GREETING from the template" > index.html
CMD ["python", "-m", "http.server", "8000"]
"""


@pytest.fixture
def client(live_server: LiveServer) -> Client:
    return Client(live_server.api_url, live_server.api_key)


@pytest.fixture
def forked_cli(live_server: LiveServer) -> Iterator[ForkedCLI]:
    """The CLI's calls forked from one interpreter that imported it (forked_cli.py): the same
    entry point, a process each, without an interpreter's start each; it imports while the
    builds run."""
    with ForkedCLI(cli_env(live_server)) as forked:
        yield forked


def cli_env(live_server: LiveServer) -> dict[str, str]:
    return {**os.environ, "PANDASTACK_API": live_server.api_url,
            "PANDASTACK_API_KEY": live_server.api_key}


def test_build_create_version_delete(live_server: LiveServer, client: Client,
                                     forked_cli: ForkedCLI, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "pandawheel", "1.0", "ANSWER = 42\n")
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.format(wheel=wheel.name))
    lines: list[str] = []
    info = client.templates.build(tmp_path / "Dockerfile", "web-app", on_log=lines.append)
    assert info.status == "ready" and info.version == 1, info
    assert any(line.startswith("Step ") for line in lines), lines
    try:
        with Sandbox.create(template="web-app", ttl_seconds=300, api_url=live_server.api_url,
                            api_key=live_server.api_key) as sbx:
            assert sbx.info.template == "web-app:1"
            # The start command's server is up at once, and the defaults apply.
            page = sbx.exec("curl -s localhost:8000/index.html")
            assert page.stdout == "hello from the template\n", page
            probe = sbx.exec("python -c 'import pandawheel; print(pandawheel.ANSWER)'; pwd; "
                             "echo $GREETING")
            assert probe.stdout == "42\n/srv\nhello\n", probe

        # A second version through the CLI; the first stays usable by its number.
        (tmp_path / "Dockerfile").write_text(
            DOCKERFILE.format(wheel=wheel.name).replace("hello", "bonjour"))
        cli = subprocess.run([sys.executable, "-m", "pandastack.cli.main", "template", "build",
                              str(tmp_path), "--name", "web-app", "--json"],
                             env=cli_env(live_server), capture_output=True, text=True, timeout=1200)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["version"] == 2
        assert "Step 1/" in cli.stderr  # the log was shown
        for which in ("web-app", "web-app:2", json.loads(cli.stdout)["build_id"]):
            logs = forked_cli("template", "logs", which)
            assert logs.returncode == 0, logs.stderr
            assert logs.stdout.startswith(f"build {json.loads(cli.stdout)['build_id']}: "
                                          "template web-app version 2\nStep 1/")
            assert "ready: 5 steps" in logs.stdout
        with Sandbox.create(template="web-app", ttl_seconds=300, api_url=live_server.api_url,
                            api_key=live_server.api_key) as v2, \
             Sandbox.create(template="web-app:1", ttl_seconds=300,
                            api_url=live_server.api_url, api_key=live_server.api_key) as v1:
            assert v2.exec("curl -s localhost:8000/").stdout == "bonjour from the template\n"
            assert v1.exec("curl -s localhost:8000/").stdout == "hello from the template\n"
            client.templates.delete("web-app", version=1)
            # A sandbox of a deleted version keeps running.
            assert v1.exec("echo $GREETING").stdout == "hello\n"
        assert [v.version for v in client.templates.get("web-app").versions] == [2]
        with pytest.raises(NotFoundError):
            Sandbox.create(template="web-app:1", ttl_seconds=60, api_url=live_server.api_url,
                           api_key=live_server.api_key)
    finally:
        client.templates.delete("web-app")
    with pytest.raises(NotFoundError):
        client.templates.get("web-app")


def test_failed_build_names_the_step(live_server: LiveServer, client: Client) -> None:
    dockerfile = "FROM base\nRUN echo fine\nRUN echo boom && exit 3\nRUN echo never\n"
    with pytest.raises(TemplateBuildError) as caught:
        client.templates.build(dockerfile, "broken")
    message = str(caught.value)
    assert "step 2/3 run echo boom" in message.lower() and "exit" in message.lower(), message
    assert "boom" in message.split("last output", 1)[-1], message
    with pytest.raises(ConflictError, match="failed to build"):
        Sandbox.create(template="broken", ttl_seconds=60, api_url=live_server.api_url,
                       api_key=live_server.api_key)
    client.templates.delete("broken")


def test_template_quota_refuses_a_build_until_a_version_is_deleted(
        live_server: LiveServer, client: Client) -> None:
    """max_template_gb (issue 37 gap) on real builds: a version's bytes are what the host
    measured (its snapshot's files); a quota that has no room for another reservation
    refuses the next build with 429; deleting the version frees its bytes. A team of its
    own, so the session's other tests never meet the quota."""
    team = "tpl-quota"
    dockerfile = "FROM base\nRUN echo small > /small\n"
    with Client(live_server.api_url, client.keys.create("quota", team=team).key) as own:
        try:
            assert own.templates.build(dockerfile, "q1").status == "ready"
            used = client.teams.get_quota(team).usage.template_gb
            print(f"a one-step template FROM base stores {used * 1024:.1f} MiB")
            assert used * (1 << 30) > 1 << 20  # a memory state and disk layers
            client.teams.set_quota(team, max_template_gb=used + BUILD_RESERVE_BYTES / 2 / (1 << 30))
            with pytest.raises(QuotaExceededError) as refused:
                own.templates.build(dockerfile, "q2")
            assert refused.value.limit == "max_template_gb", refused.value
            own.templates.delete("q1")
            assert client.teams.get_quota(team).usage.template_gb == 0
            assert own.templates.build(dockerfile, "q2").status == "ready"
        finally:
            for name in ("q1", "q2"):
                with contextlib.suppress(NotFoundError):
                    own.templates.delete(name)
