"""Operator settings for image pulls, from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from pandastack.host.images.oci.settings import MIB, RegistrySettings


def test_settings_come_from_the_environment() -> None:
    conf = RegistrySettings.from_env({
        "PANDASTACK_INSECURE_REGISTRIES": "127.0.0.1:5000, registry.lan:80",
        "PANDASTACK_REGISTRY_MIRRORS": "docker.io=127.0.0.1:5000,ghcr.io=mirror.lan",
        "PANDASTACK_REGISTRY_CA_BUNDLE": "/etc/ssl/corp.pem",
        "PANDASTACK_IMAGE_MAX_MB": "512", "PANDASTACK_IMAGE_MAX_LAYERS": "10",
        "PANDASTACK_IMAGE_MAX_UNPACKED_MB": "1024", "PANDASTACK_LAYER_CACHE_MB": "2048"})
    assert conf.insecure == {"127.0.0.1:5000", "registry.lan:80"}
    # docker.io is asked at registry-1.docker.io: its mirror is keyed so.
    assert conf.endpoint("registry-1.docker.io") == "http://127.0.0.1:5000"
    assert conf.endpoint("ghcr.io") == "https://mirror.lan"
    assert conf.endpoint("quay.io") == "https://quay.io"
    assert conf.ca_bundle == Path("/etc/ssl/corp.pem")
    assert (conf.max_image_bytes, conf.max_layers, conf.max_unpacked_bytes,
            conf.layer_cache_bytes) == (512 * MIB, 10, 1024 * MIB, 2048 * MIB)


def test_defaults_and_bad_values() -> None:
    conf = RegistrySettings.from_env({})
    assert conf.insecure == frozenset() and conf.mirrors == {}
    assert conf.max_image_bytes == 10 << 30
    assert conf.allows("https", "anything:443") and not conf.allows("http", "127.0.0.1:80")
    with pytest.raises(ValueError, match="is not registry=host"):
        RegistrySettings.from_env({"PANDASTACK_REGISTRY_MIRRORS": "docker.io"})
    with pytest.raises(ValueError, match="max_layers must be positive"):
        RegistrySettings.from_env({"PANDASTACK_IMAGE_MAX_LAYERS": "0"})
