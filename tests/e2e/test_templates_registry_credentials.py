"""A team's registry credentials through the public SDK on real VMs (issue 37): team A logs in
to a private registry on loopback, behind basic auth and behind the bearer-token service the
tests run, and builds a template FROM its private image (one build per flow); team B, whose
host holds that image's layers and guest image by then, cannot build from it without
credentials of its own, nor with a wrong password. The password is in no build log line (the
build's VM printing its environment and kernel command line), no answer and no server log."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack import Client
from pandastack.sdk.errors import PandastackError
from pandastack.server.registries.sealing import make_key_file
from tests.e2e.conftest import LiveServer, run_live_server
from tests.host.images.oci.conftest import (
    PASSWORD,
    USER,
    TokenRegistry,
    basic_registry,
    needs_registry,
    skopeo_policy,
    token_registry,
)
from tests.host.images.oci.helpers import push_image
from tests.host.images.oci.layers import busybox_layer, file, gzipped
from tests.host.images.oci.registry import Registry

pytestmark = [pytest.mark.e2e, pytest.mark.vm, needs_registry, pytest.mark.timeout(1500)]
__all__ = ["basic_registry", "skopeo_policy", "token_registry"]  # fixtures, used by name


@pytest.fixture(scope="module")
def server(basic_registry: Registry, token_registry: TokenRegistry,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    key = tmp_path_factory.mktemp("key") / "encryption.key"
    make_key_file(key)  # what `pandastack setup` does
    insecure = [basic_registry.host, token_registry.registry.host, token_registry.realm_host]
    with run_live_server({"PANDASTACK_INSECURE_REGISTRIES": ",".join(insecure),
                          "PANDASTACK_ENCRYPTION_KEY_FILE": str(key)}) as live:
        yield live


def team_b(server: LiveServer) -> Client:
    admin = Client(server.api_url, server.api_key)
    key = admin.keys.create(f"b-{uuid.uuid4().hex[:6]}", team="team-b").key
    return Client(server.api_url, key)


def private_image(registry: Registry, tmp: Path, policy: Path, repository: str) -> tuple[str, str]:
    marker = uuid.uuid4().hex
    push_image(registry, tmp, policy, repository,
               [gzipped(busybox_layer()), gzipped([file("marker", marker + "\n")])],
               config={"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
               creds=f"{USER}:{PASSWORD}")
    return f"{registry.host}/{repository}:v1", marker


def build_with_and_without(server: LiveServer, registry: str, image: str, marker: str,
                           name: str) -> None:
    a = Client(server.api_url, server.api_key)
    stored = a.registries.login(registry, USER, PASSWORD)
    assert (stored.registry, stored.username) == (registry, USER)
    assert PASSWORD not in repr(a.registries.list())
    lines: list[str] = []
    info = a.templates.build(f"FROM {image}\nRUN cat /marker; env; cat /proc/cmdline\n", name,
                             on_log=lines.append)
    try:
        assert info.status == "ready", (info, lines[-20:])
        assert marker in lines, lines[-20:]
        assert not [line for line in lines if PASSWORD in line]

        # Team B: the host has the image's layers and guest image now; B's pull still asks
        # the registry for the manifest, with B's credentials: none, then a wrong password.
        b = team_b(server)
        with pytest.raises(PandastackError, match=rf"{image}: .*(needs credentials|refused)"):
            b.templates.build(f"FROM {image}\nRUN true\n", name)
        b.registries.login(registry, USER, "wrong horse")
        with pytest.raises(PandastackError, match=rf"{image}: .*refused user '{USER}'"):
            b.templates.build(f"FROM {image}\nRUN true\n", name)
        assert not [t for t in b.templates.list() if t.status == "ready"]
    finally:
        a.templates.delete(name)
    a.registries.logout(registry)
    log = (server.state_dir.parent / "server.log").read_text(errors="replace")
    assert PASSWORD not in log


def test_basic_auth_credentials(server: LiveServer, basic_registry: Registry,
                                skopeo_policy: Path, tmp_path: Path) -> None:
    image, marker = private_image(basic_registry, tmp_path, skopeo_policy, "team/basic")
    build_with_and_without(server, basic_registry.host, image, marker, "private-basic")


def test_bearer_token_credentials(server: LiveServer, token_registry: TokenRegistry,
                                  skopeo_policy: Path, tmp_path: Path) -> None:
    registry = token_registry.registry
    image, marker = private_image(registry, tmp_path, skopeo_policy, "team/token")
    build_with_and_without(server, registry.host, image, marker, "private-token")
