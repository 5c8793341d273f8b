"""Guest images from OCI images, without booting them: built once per manifest, and never
served to a caller the registry refuses, even when built already (ADR 0046's access rule)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pandastack.host.images.build import GuestImage, ensure_base_image
from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.errors import RegistryAuthError
from pandastack.host.images.oci.guest_image import ensure_oci_image
from pandastack.rules import DEFAULT_HOME
from tests.host.images.oci.conftest import PASSWORD, USER, needs_registry
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
