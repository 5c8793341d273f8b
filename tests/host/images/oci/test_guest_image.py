"""Guest images from OCI images, without booting them: built once per manifest, and never
served to a caller the registry refuses, even when built already (ADR 0046's access rule); a
rebuild through the API's path asks the registry for manifests only; a hostile layer fails
the build, before any boot, with the message the SDK shows (`image <ref>: ...`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.images.build import GuestImage, ensure_base_image
from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.errors import ImageTooLarge, RegistryAuthError, UnsafeLayerEntry
from pandastack.host.images.oci.guest_image import ensure_oci_image
from pandastack.host.local import LocalHost
from pandastack.host.runtime import HostRuntime
from pandastack.rules import DEFAULT_HOME
from tests.host.images.oci.conftest import PASSWORD, USER, needs_registry
from tests.host.images.oci.counting import counting_proxy
from tests.host.images.oci.helpers import push_image, settings
from tests.host.images.oci.layers import busybox_layer, file, gzipped
from tests.host.images.oci.registry import Registry

pytestmark = [needs_registry, pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root (the image's owners on its disk)")]


@pytest.fixture(scope="module")
def base() -> GuestImage:
    return ensure_base_image(DEFAULT_HOME, progress=lambda _: None)


def test_a_built_private_image_is_not_served_to_a_caller_the_registry_refuses(
        basic_registry: Registry, tmp_path: Path, skopeo_policy: Path, base: GuestImage) -> None:
    push_image(basic_registry, tmp_path, skopeo_policy, "team-a/private",
               [gzipped([*busybox_layer(), file("secret", "a's")])], creds=f"{USER}:{PASSWORD}")
    image = f"{basic_registry.host}/team-a/private:v1"
    conf = settings(basic_registry.host)
    home = tmp_path / "home"
    built = ensure_oci_image(home, image, base=base, settings=conf,
                             credentials=Credentials(USER, PASSWORD), progress=lambda _: None)
    meta = json.loads((built.rootfs.parent / "image.json").read_text())
    assert meta["image"] == image and meta["variant"] == f"oci:{image}"
    assert built.kernel_version == base.kernel_version
    for credentials in (None, Credentials(USER, "guessed")):
        with pytest.raises(RegistryAuthError, match=f"{image}: the registry"):
            ensure_oci_image(home, image, base=base, settings=conf, credentials=credentials,
                             progress=lambda _: None)
    again = ensure_oci_image(home, image, base=base, settings=conf,
                             credentials=Credentials(USER, PASSWORD), progress=lambda _: None)
    assert again.key == built.key and again.rootfs == built.rootfs


async def test_a_rebuild_through_the_api_path_asks_the_registry_for_manifests_only(
        registry: Registry, tmp_path: Path, skopeo_policy: Path, base: GuestImage,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a build request FROM an image does on the host: the API's lookup
    (LocalHost.inspect_image, settings from the environment) and then the build's pull."""
    with counting_proxy(registry.host) as proxy:
        monkeypatch.setenv("PANDASTACK_INSECURE_REGISTRIES", proxy.host)
        push_image(registry, tmp_path, skopeo_policy, "tests/rebuild",
                   [gzipped([*busybox_layer(), file("app", "v1")])])
        image = f"{proxy.host}/tests/rebuild:v1"
        home = tmp_path / "home"
        host = LocalHost(HostRuntime(HostConfig(home=home, state_dir=tmp_path / "state",
                                                snapshots_root=tmp_path / "snapshots"),
                                     progress=lambda _: None), owns_runtime=False)

        async def build() -> GuestImage:
            await host.inspect_image(image)
            return await asyncio.to_thread(ensure_oci_image, home, image, base=base,
                                           settings=settings(proxy.host),
                                           progress=lambda _: None)

        first = await build()
        assert len(proxy.blobs()) == 2  # the config and the one layer
        proxy.paths.clear()
        assert (await build()).key == first.key
        assert proxy.paths == ["/v2/tests/rebuild/manifests/v1"] * 2, proxy.paths


@pytest.mark.parametrize(("entries", "error", "message"), [
    ([file("zeros", bytes(32 << 20))], ImageTooLarge, "unpacks to more than 16777216 bytes"),
    ([file("../outside", "owned")], UnsafeLayerEntry, r"'\.\./outside' has a '\.\.' comp"),
], ids=["gzip-bomb", "dot-dot"])
def test_a_hostile_layer_fails_the_build_naming_the_image(
        registry: Registry, tmp_path: Path, skopeo_policy: Path, base: GuestImage,
        entries: list[object], error: type[Exception], message: str) -> None:
    repository = f"tests/hostile-{tmp_path.name.lower()}"
    push_image(registry, tmp_path, skopeo_policy, repository,
               [gzipped(entries)])  # type: ignore[arg-type]
    image = f"{registry.host}/{repository}:v1"
    home = tmp_path / "home"
    with pytest.raises(error, match=f"^image {re.escape(image)}: .*{message}"):
        ensure_oci_image(home, image, base=base, progress=lambda _: None,
                         settings=settings(registry.host, max_unpacked_bytes=16 << 20))
    assert not list((home / "cache" / "images").glob("*/image.json"))  # no guest image
