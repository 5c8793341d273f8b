"""Pulling from a real registry on loopback (Debian's docker-registry), images made and pushed
here: layers with whiteouts and an opaque directory, a multi-architecture index, the image
config, digests, the layer cache, and what a registry or an image can do wrong."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from pandastack.host.images.oci.cache import LayerCache
from pandastack.host.images.oci.errors import (
    ImageInvalid,
    ImageNotFound,
    ImageTooLarge,
    RegistryUnavailable,
)
from pandastack.host.images.oci.hosts import RegistryRefused
from pandastack.host.images.oci.pull import pull_image
from pandastack.host.images.oci.reference import DOCKER_HUB_API
from pandastack.host.images.oci.settings import RegistrySettings
from tests.host.images.oci.conftest import needs_registry
from tests.host.images.oci.helpers import pull, push_image, settings
from tests.host.images.oci.layers import (
    BUSYBOX,
    LAYER_TAR,
    LAYER_ZSTD,
    Layout,
    busybox_layer,
    directory,
    file,
    gzipped,
    layer_digest,
    skopeo_push,
    symlink,
    tar_bytes,
)
from tests.host.images.oci.registry import Registry

pytestmark = needs_registry

CONFIG: dict[str, object] = {
    "Env": ["PATH=/usr/local/bin:/bin", "GREETING=hello world"], "WorkingDir": "/app",
    "User": "app", "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo $GREETING"],
    "ExposedPorts": {"8080/tcp": {}, "53/udp": {}}}


def three_layers() -> list[bytes]:
    return [
        gzipped([*busybox_layer(), directory("app"), file("app/old.txt", "lower"),
                 directory("cache"), file("cache/stale", "lower"), directory("cache/sub"),
                 file("cache/sub/deep", "lower"), file("app/keep.txt", "kept")]),
        gzipped([file("app/.wh.old.txt", ""), directory("cache"),
                 file("cache/fresh", "upper"), file("cache/.wh..wh..opq", "")]),
        gzipped([file("app/main.sh", "echo hi\n", mode=0o755),
                 symlink("app/current", "/app/main.sh")]),
    ]


def test_layers_apply_in_order_with_whiteouts_and_the_config_is_read(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    digest = push_image(registry, tmp_path, skopeo_policy, "tests/layered", three_layers(),
                        CONFIG)
    pulled, root = pull(f"{registry.host}/tests/layered:v1", tmp_path, settings(registry.host))
    assert pulled.image.manifest_digest == digest
    assert not (root / "app/old.txt").exists()  # whiteout of a lower file
    assert (root / "app/keep.txt").read_text() == "kept"
    assert sorted(os.listdir(root / "cache")) == ["fresh"]  # opaque: lower children gone
    assert os.readlink(root / "app/current") == "/app/main.sh"
    assert (root / "app/main.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "bin/busybox").read_bytes()[:4] == b"\x7fELF"
    config = pulled.image.config
    assert config.env == (("PATH", "/usr/local/bin:/bin"), ("GREETING", "hello world"))
    assert (config.working_dir, config.user) == ("/app", "app")
    assert config.start_command == ("/bin/sh", "-c", "echo $GREETING")
    assert config.exposed_ports == ("53/udp", "8080/tcp")
    # Pinned by digest, the same manifest.
    again, _ = pull(f"{registry.host}/tests/layered@{digest}", tmp_path, settings(registry.host))
    assert again.image.manifest_digest == digest


def test_a_multi_architecture_index_gives_its_linux_amd64_image(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    layout = Layout(tmp_path / "multi")
    index = layout.index({
        "arm64": layout.image([gzipped([file("arch", "arm64")])], architecture="arm64"),
        "amd64": layout.image([gzipped([file("arch", "amd64")])]),
    })
    skopeo_push(layout.tag(index, "v1"), f"{registry.host}/tests/multi:v1", skopeo_policy,
                all_platforms=True)
    pulled, root = pull(f"{registry.host}/tests/multi:v1", tmp_path, settings(registry.host))
    assert (root / "arch").read_text() == "amd64"
    assert pulled.image.digest == index["digest"]
    assert pulled.image.manifest_digest != pulled.image.digest


def test_a_mirror_serves_docker_hub_names(registry: Registry, tmp_path: Path,
                                          skopeo_policy: Path) -> None:
    push_image(registry, tmp_path, skopeo_policy, "library/python",
               [gzipped([file("etc/os-release", "ID=test\n")])])
    conf = RegistrySettings.from_env({"PANDASTACK_REGISTRY_MIRRORS": f"docker.io={registry.host}",
                                      "PANDASTACK_INSECURE_REGISTRIES": registry.host})
    pulled, root = pull("python:v1", tmp_path, conf)
    assert str(pulled.image.reference) == "docker.io/library/python:v1"
    assert (root / "etc/os-release").read_text() == "ID=test\n"


def test_a_cached_layer_is_not_fetched_again_but_another_repository_must_serve_it(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    shared = gzipped([file("shared", "base layer")])
    own = gzipped([file("own", "second")])
    push_image(registry, tmp_path, skopeo_policy, "tests/cached-a", [shared, own])
    push_image(registry, tmp_path, skopeo_policy, "tests/cached-b", [shared])
    cache = LayerCache(tmp_path / "cache", 1 << 30)
    conf = settings(registry.host)
    arrived: dict[str, list[tuple[int, int]]] = {}

    def on_bytes(digest: str, done: int, total: int) -> None:
        arrived.setdefault(digest, []).append((done, total))

    first, _ = pull(f"{registry.host}/tests/cached-a:v1", tmp_path, conf, cache,
                    on_bytes=on_bytes)
    assert len(first.fetched) == 2
    sizes = {layer.digest: layer.size for layer in first.image.manifest.layers}
    assert {digest: events[-1] for digest, events in arrived.items()} == {
        digest: (size, size) for digest, size in sizes.items()}
    arrived.clear()
    second, root = pull(f"{registry.host}/tests/cached-a:v1", tmp_path, conf, cache,
                        on_bytes=on_bytes)
    assert second.fetched == ()
    assert arrived == {}
    assert (root / "own").read_text() == "second"
    # Same digest, other repository: fetched from it (and verified) once, then cached for it.
    other, _ = pull(f"{registry.host}/tests/cached-b:v1", tmp_path, conf, cache)
    assert len(other.fetched) == 1
    again, _ = pull(f"{registry.host}/tests/cached-b:v1", tmp_path, conf, cache)
    assert again.fetched == ()


def test_another_pulls_eviction_mid_pull_passes_over_the_layer_in_use(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    """Another pull (another cache object, as in another process) evicts down to nothing
    while this one reads its first layer: that layer, open, stays; the second, not yet
    opened, goes and is fetched again; the root is whole."""
    first, second = gzipped([file("one", "1")]), gzipped([file("two", "2")])
    push_image(registry, tmp_path, skopeo_policy, "tests/mid-pull", [first, second])
    image = f"{registry.host}/tests/mid-pull:v1"
    conf = settings(registry.host)
    cache = LayerCache(tmp_path / "cache", 1 << 30)
    pull(image, tmp_path, conf, cache)
    evicted: list[int] = []

    def progress(line: str) -> None:
        if line.startswith("layer 1/2") and line.endswith(": cached"):
            evicted.append(LayerCache(tmp_path / "cache", 1).evict())

    root = tmp_path / "mid-root"
    root.mkdir()
    pulled = pull_image(image, root, settings=conf, cache=cache, progress=progress)
    assert evicted == [len(second)]
    assert pulled.fetched == (layer_digest(second),)
    assert (root / "one").read_text() == "1" and (root / "two").read_text() == "2"


def test_missing_images_and_tags_name_the_image(registry: Registry, tmp_path: Path,
                                                skopeo_policy: Path) -> None:
    push_image(registry, tmp_path, skopeo_policy, "tests/present", [gzipped([file("a", "a")])])
    conf = settings(registry.host)
    with pytest.raises(ImageNotFound, match=r"tests/present:nope.*manifest nope"):
        pull(f"{registry.host}/tests/present:nope", tmp_path, conf)
    with pytest.raises(ImageNotFound, match=r"tests/absent:v1: .* no manifest v1"):
        pull(f"{registry.host}/tests/absent:v1", tmp_path, conf)


def test_plain_http_only_to_the_operators_insecure_registries(registry: Registry,
                                                              tmp_path: Path) -> None:
    # A mirror is the operator's (its loopback address allowed) but not listed insecure:
    # HTTPS to an HTTP port.
    mirrored = RegistrySettings(mirrors={DOCKER_HUB_API: registry.host})
    with pytest.raises(RegistryUnavailable, match=registry.host):
        pull("tests/layered:v1", tmp_path, mirrored)


def test_a_loopback_registry_the_operator_did_not_list_is_refused(registry: Registry,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(RegistryRefused, match=r"registry host 127\.0\.0\.1 is not a public"):
        pull(f"{registry.host}/tests/layered:v1", tmp_path, settings())


def test_a_blob_that_is_not_its_digest_is_refused(registry: Registry, tmp_path: Path,
                                                  skopeo_policy: Path) -> None:
    layer = gzipped([file("payload", "the real bytes")])
    push_image(registry, tmp_path, skopeo_policy, "tests/tampered", [layer])
    stored = registry.blob_file(layer_digest(layer))
    stored.write_bytes(gzipped([file("payload", "other bytes!!!")])[:len(layer)].ljust(
        len(layer), b"\0"))
    with pytest.raises(ImageInvalid, match="arrived as other bytes"):
        pull(f"{registry.host}/tests/tampered:v1", tmp_path, settings(registry.host))


def test_size_and_layer_bounds_stop_before_any_layer_is_fetched(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    layers = [gzipped([file(f"f{n}", os.urandom(2048))]) for n in range(3)]
    push_image(registry, tmp_path, skopeo_policy, "tests/bounded", layers)
    cache = LayerCache(tmp_path / "cache", 1 << 30)
    with pytest.raises(ImageTooLarge, match="3 layers; the bound is 2"):
        pull(f"{registry.host}/tests/bounded:v1", tmp_path,
             settings(registry.host, max_layers=2), cache)
    with pytest.raises(ImageTooLarge, match="the bound is 4096"):
        pull(f"{registry.host}/tests/bounded:v1", tmp_path,
             settings(registry.host, max_image_bytes=4096), cache)
    assert cache.size() == 0


def test_a_gzip_bomb_in_a_registry_stops_at_the_unpacked_bound(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    bomb = gzipped([file("zeros", bytes(64 << 20))])
    assert len(bomb) < 1 << 20
    push_image(registry, tmp_path, skopeo_policy, "tests/bomb", [bomb])
    with pytest.raises(ImageTooLarge, match="unpacks to more than"):
        pull(f"{registry.host}/tests/bomb:v1", tmp_path,
             settings(registry.host, max_unpacked_bytes=8 << 20))


def test_zstd_layers_skopeo_compressed_pull_and_unpack(
        registry: Registry, tmp_path: Path, skopeo_policy: Path) -> None:
    lower = tar_bytes([*busybox_layer(), directory("app"), file("app/old", "lower")])
    upper = tar_bytes([file("app/.wh.old", ""), file("app/new", "upper" * 1000)])
    layout = Layout(tmp_path / "zstd")
    manifest = layout.manifest([layout.blob(lower, LAYER_TAR), layout.blob(upper, LAYER_TAR)],
                               [layer_digest(lower), layer_digest(upper)])
    skopeo_push(layout.tag(manifest, "v1"), f"{registry.host}/tests/zstd:v1", skopeo_policy,
                compress_format="zstd")
    cache = LayerCache(tmp_path / "cache", 1 << 30)
    pulled, root = pull(f"{registry.host}/tests/zstd:v1", tmp_path, settings(registry.host),
                        cache)
    layers = pulled.image.manifest.layers
    assert [layer.media_type for layer in layers] == [LAYER_ZSTD, LAYER_ZSTD]
    for layer in layers:
        blob = cache.open(layer.digest, f"{registry.host}/tests/zstd")
        assert blob is not None
        with blob:
            assert blob.read(4) == b"\x28\xb5\x2f\xfd"
    assert (root / "bin/busybox").read_bytes() == BUSYBOX.read_bytes()
    assert sorted(os.listdir(root / "app")) == ["new"]
    assert (root / "app/new").read_text() == "upper" * 1000


def test_a_registry_that_does_not_answer_fails_within_the_deadline(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable, match=rf"{host}/tests/x:v1.*did not answer"):
            pull(f"{host}/tests/x:v1", tmp_path, settings(host, timeout_s=1.0))
        assert time.monotonic() - started < 10
    with pytest.raises(RegistryUnavailable, match="could not be reached"):  # now closed
        pull(f"{host}/tests/x:v1", tmp_path, settings(host, timeout_s=1.0))
