"""Pushing the tests' images and pulling them back (test_pull, test_auth)."""

from __future__ import annotations

from pathlib import Path

from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.cache import LayerCache
from pandastack.host.images.oci.pull import LayerBytes, PulledImage, pull_image
from pandastack.host.images.oci.settings import RegistrySettings
from tests.host.images.oci.layers import Layout, skopeo_push
from tests.host.images.oci.registry import Registry


def push_image(registry: Registry, tmp: Path, policy: Path, repository: str,
               layers: list[bytes], config: dict[str, object] | None = None,
               creds: str | None = None) -> str:
    """Push an image; return its manifest digest."""
    layout = Layout(tmp / repository.replace("/", "_"))
    manifest = layout.image(layers, config)
    skopeo_push(layout.tag(manifest, "v1"), f"{registry.host}/{repository}:v1", policy,
                creds=creds)
    return str(manifest["digest"])


def settings(*insecure: str, **overrides: object) -> RegistrySettings:
    return RegistrySettings(insecure=frozenset(insecure), **overrides)  # type: ignore[arg-type]


def pull(image: str, tmp: Path, conf: RegistrySettings, cache: LayerCache | None = None,
         credentials: Credentials | None = None,
         on_bytes: LayerBytes | None = None) -> tuple[PulledImage, Path]:
    rootfs = tmp / f"rootfs-{len(list(tmp.glob('rootfs-*')))}"
    rootfs.mkdir()
    pulled = pull_image(image, rootfs, settings=conf, credentials=credentials,
                        cache=cache or LayerCache(tmp / "cache", 1 << 30), on_bytes=on_bytes)
    return pulled, rootfs
