"""A team template FROM an OCI image through the public SDK (issue 37): a busybox-only image
on the loopback registry (the operator lists it in PANDASTACK_INSECURE_REGISTRIES), built
with RUN, ENV, USER and WORKDIR steps; a sandbox of the template sees the image's files, its
config's Env (the build's ENV over it where both set a name) and the build's files, made as
the image's numeric User and then as the USER named (no runuser in such an image: steps run
as a user through the agent). A missing image is the build request's 404 naming it, a user
the image lacks a failed build naming it; a version lists its image's ExposedPorts.
`FROM python:3.12-slim` by name through the operator's mirror (PANDASTACK_REGISTRY_MIRRORS),
a Debian (glibc) image, in a multi-stage build."""

from __future__ import annotations

import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack import Client, NotFoundError, Sandbox
from pandastack.sdk.errors import TemplateBuildError
from tests.e2e.conftest import LiveServer, run_live_server
from tests.host.images.oci.conftest import needs_registry, registry, skopeo_policy
from tests.host.images.oci.helpers import push_image
from tests.host.images.oci.layers import (
    LAYER_TAR,
    Entry,
    Layout,
    busybox_layer,
    file,
    gzipped,
    skopeo_push,
)
from tests.host.images.oci.registry import Registry
from tests.host.images.oci.test_real_rootfs import BASE_TAR

pytestmark = [pytest.mark.e2e, pytest.mark.vm, needs_registry, pytest.mark.timeout(1500)]
__all__ = ["registry", "skopeo_policy"]  # the OCI tests' fixtures, used here by name


@pytest.fixture(scope="module")
def oci_server(registry: Registry) -> Iterator[LiveServer]:
    # Docker Hub's names are asked of the loopback registry, as of an operator's pull-through
    # mirror: no test reaches docker.io.
    with run_live_server({"PANDASTACK_INSECURE_REGISTRIES": registry.host,
                          "PANDASTACK_REGISTRY_MIRRORS": f"docker.io={registry.host}"}) as server:
        yield server


def test_a_template_from_an_image_sees_its_files_and_env(
        oci_server: LiveServer, registry: Registry, skopeo_policy: Path,
        tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    users = [Entry("app", kind=tarfile.DIRTYPE, mode=0o755, uid=1000, gid=1000),
             file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"
                  "worker:x:1001:1001::/home/worker:/bin/sh\n"),
             file("etc/group", "root:x:0:\napp:x:1000:\nworker:x:1001:\n")]
    push_image(registry, tmp_path, skopeo_policy, "tests/busybox-sdk",
               [gzipped(busybox_layer()),
                gzipped([*users, file("app/marker", marker + "\n")])],
               config={"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "FROM_IMAGE=image",
                               "OVERRIDDEN=image"], "WorkingDir": "/app",
                       "User": "1000:1000"})  # a uid, as real images often have it
    client = Client(oci_server.api_url, oci_server.api_key)
    image = f"{registry.host}/tests/busybox-sdk:v1"
    dockerfile = (f"FROM {image}\n"
                  "ENV OVERRIDDEN=build\n"
                  "RUN pwd > built-in; echo \"$FROM_IMAGE $OVERRIDDEN\" >> built-in\n"
                  "USER worker\n"
                  "WORKDIR /home/worker\n"
                  "RUN echo made > here\n")
    lines: list[str] = []
    info = client.templates.build(dockerfile, "from-busybox", on_log=lines.append)
    assert info.status == "ready", (info, lines[-20:])
    # pulled from the registry (2 layers), then the steps ran on it
    assert any("tests/busybox-sdk:v1: sha256:" in line and "2 layers" in line
               for line in lines), lines
    assert any(line.startswith("Step 5/5 RUN echo made") for line in lines), lines
    try:
        with Sandbox.create(template="from-busybox", ttl_seconds=300,
                            api_url=oci_server.api_url, api_key=oci_server.api_key) as sbx:
            # The image has no `id` or `stat` of its own: busybox's, by name.
            probe = sbx.exec("cat /app/marker /app/built-in /home/worker/here; pwd; "
                             "echo $FROM_IMAGE $OVERRIDDEN; busybox id -un; busybox id -u; "
                             "busybox stat -c '%U %u' /app/built-in /home/worker/here")
            assert probe.exit_code == 0, probe
            # the template's user (the last USER) is the sandbox's default one, as in Docker
            assert probe.stdout.split("\n") == [
                marker, "/app", "image build", "made", "/home/worker", "image build", "worker",
                "1001", "app 1000", "worker 1001", ""], probe
    finally:
        client.templates.delete("from-busybox")

    # A user the image does not have: the build fails naming it (the base is cached now).
    with pytest.raises(TemplateBuildError, match=r"no user 'ghost' in the base's /etc/passwd"):
        client.templates.build(f"FROM {image}\nUSER ghost\nRUN true\n", "from-ghost")
    client.templates.delete("from-ghost")

    # Asked of the registry when the build is requested: the request's 404, no version made.
    missing = f"{registry.host}/tests/no-such-image:v1"
    with pytest.raises(NotFoundError, match=rf"^image {missing}: the registry has no"):
        client.templates.build(f"FROM {missing}\nRUN true\n", "from-nothing")
    with pytest.raises(NotFoundError):
        client.templates.get("from-nothing")


def test_the_images_own_cmd_as_the_start_command(
        oci_server: LiveServer, registry: Registry, skopeo_policy: Path,
        tmp_path: Path) -> None:
    """Asked for (`# pandastack: start image`), the image's Entrypoint and Cmd are started
    before the snapshot: a sandbox finds the process running; its ExposedPorts, with the
    Dockerfile's EXPOSE, are listed in the build log and the template's info."""
    push_image(registry, tmp_path, skopeo_policy, "tests/busybox-cmd", [gzipped(busybox_layer())],
               config={"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
                       "Entrypoint": ["/bin/sh", "-c"],
                       # (a busybox-only image has no /tmp)
                       "Cmd": ["mkdir -p /tmp; echo \"up as $0\" > /tmp/up; "
                               "exec sleep 100000"],
                       "ExposedPorts": {"8080/tcp": {}}})
    client = Client(oci_server.api_url, oci_server.api_key)
    lines: list[str] = []
    info = client.templates.build(f"FROM {registry.host}/tests/busybox-cmd:v1\n"
                                  "# pandastack: start image\n"
                                  "# pandastack: ready file /tmp/up\n"
                                  "EXPOSE 9000 8080/tcp\n", "from-cmd",
                                  on_log=lines.append)
    assert info.status == "ready", (info, lines[-20:])
    assert any(line.endswith("exposes 8080/tcp") for line in lines), lines
    assert any(line.endswith("exposes 8080/tcp, 9000/tcp") for line in lines), lines
    assert info.exposed_ports == ["8080/tcp", "9000/tcp"]
    assert [v.exposed_ports for v in client.templates.get("from-cmd").versions] == [
        ["8080/tcp", "9000/tcp"]]
    assert any(line.startswith("START /bin/sh -c 'mkdir -p /tmp;") for line in lines), lines
    try:
        with Sandbox.create(template="from-cmd", ttl_seconds=300,
                            api_url=oci_server.api_url, api_key=oci_server.api_key) as sbx:
            # No pgrep in the image: the processes' names from /proc.
            probe = sbx.exec("cat /tmp/up; for f in /proc/[0-9]*/comm; do "
                             "[ \"$(cat $f)\" = sleep ] && echo running; done; true")
            assert probe.exit_code == 0, probe
            assert probe.stdout == "up as /bin/sh\nrunning\n", probe
    finally:
        client.templates.delete("from-cmd")


def test_python_slim_by_name_through_the_mirror_in_a_multi_stage_build(
        oci_server: LiveServer, registry: Registry, skopeo_policy: Path,
        tmp_path: Path) -> None:
    """`FROM python:3.12-slim` by its Docker Hub name through the operator's mirror (the
    loopback registry): the image builder's Debian root (~200 MiB, one uncompressed layer,
    glibc and python3) stands in for it as library/python. Both stages of a multi-stage build
    start from it, the second copies the first's file; a second template on the same image
    pulls nothing."""
    if not BASE_TAR.exists():
        pytest.skip("needs the image builder's cached base.tar (make run builds it)")
    layout = Layout(tmp_path / "layout")
    layer = layout.blob_file(BASE_TAR, LAYER_TAR)
    manifest = layout.manifest([layer], [str(layer["digest"])], {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8"], "Cmd": ["python3"]})
    skopeo_push(layout.tag(manifest, "3.12-slim"),
                f"{registry.host}/library/python:3.12-slim", skopeo_policy)
    client = Client(oci_server.api_url, oci_server.api_key)
    lines: list[str] = []
    info = client.templates.build("FROM python:3.12-slim AS build\n"
                                  "RUN echo built-in-stage-1 > /out\n"
                                  "FROM python:3.12-slim\n"
                                  "COPY --from=build /out /app/out\n"
                                  "ENV GREETING=hello\n"
                                  "WORKDIR /app\n", "from-python-slim", on_log=lines.append)
    assert info.status == "ready", (info, lines[-20:])
    # Pulled now (an earlier run's guest image may be in the images cache, keyed by the
    # manifest): the log says how far the layer's download got, up to all of it.
    if any(": pulling " in line for line in lines):
        assert any(line.startswith("layer 1/1 sha256:") and ": 100 % (" in line
                   for line in lines), lines
    second: list[str] = []
    started = time.monotonic()
    again = client.templates.build("FROM python:3.12-slim\nRUN python3 -c 'print(1)'\n",
                                   "from-python-slim-2", on_log=second.append)
    print(f"a second template on the same image: {time.monotonic() - started:.1f} s")
    try:
        assert again.status == "ready", (again, second[-20:])
        assert not any(": pulling " in line or line.startswith("layer ") for line in second), \
            second
        with Sandbox.create(template="from-python-slim", ttl_seconds=300,
                            api_url=oci_server.api_url,
                            api_key=oci_server.api_key) as sbx:
            probe = sbx.exec("cat /app/out; pwd; echo $GREETING; python3 -c "
                             "'import platform; print(platform.libc_ver()[0])'")
            assert probe.exit_code == 0, probe
            assert probe.stdout == "built-in-stage-1\n/app\nhello\nglibc\n", probe
    finally:
        client.templates.delete("from-python-slim")
        client.templates.delete("from-python-slim-2")
