"""The image config kept in the layer cache (ADR 0046): a rebuild of a cached image asks the
registry for its manifest only; the config's cached bytes serve only the repository they were
verified from, as layers do. Against the loopback registry, whose copy of the config is
removed to show where a resolve read it from."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pandastack.host.images.oci.cache import LayerCache
from pandastack.host.images.oci.client import RegistryClient
from pandastack.host.images.oci.errors import ImageError
from pandastack.host.images.oci.reference import parse_reference
from tests.host.images.oci.conftest import needs_registry
from tests.host.images.oci.helpers import push_image, settings
from tests.host.images.oci.layers import busybox_layer, gzipped
from tests.host.images.oci.registry import Registry

pytestmark = needs_registry


def _resolve(image: str, registry: Registry, cache: LayerCache | None) -> dict[str, str]:
    with RegistryClient(parse_reference(image), settings(registry.host), cache=cache) as client:
        return dict(client.resolve().config.env)


def test_a_cached_config_is_not_asked_of_the_registry_again(
        registry: Registry, skopeo_policy: Path, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex  # a config of its own: no other test's digest
    env = {"MARKER": marker}
    push_image(registry, tmp_path, skopeo_policy, "tests/config-a",
               [gzipped(busybox_layer())], config={"Env": [f"MARKER={marker}"]})
    push_image(registry, tmp_path, skopeo_policy, "tests/config-b",
               [gzipped(busybox_layer())], config={"Env": [f"MARKER={marker}"]})
    cache = LayerCache(tmp_path / "cache", 1 << 30)
    image_a, image_b = f"{registry.host}/tests/config-a:v1", f"{registry.host}/tests/config-b:v1"
    assert _resolve(image_a, registry, cache) == env
    with RegistryClient(parse_reference(image_a), settings(registry.host)) as client:
        config = client.resolve().manifest.config
    # The registry's only copy of the config goes: a resolve that asks for it fails.
    registry.blob_file(config.digest).unlink()
    with pytest.raises(ImageError):
        _resolve(image_a, registry, None)
    assert _resolve(image_a, registry, cache) == env  # the manifest only
    # Another repository naming the same digest is not served the cached bytes: they were
    # verified from config-a, and config-b must show it has them (here: it no longer has).
    with pytest.raises(ImageError):
        _resolve(image_b, registry, cache)
