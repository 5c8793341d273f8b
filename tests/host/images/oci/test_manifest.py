"""Manifests, indexes and configs parsed from what registries serve."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pandastack.host.images.oci.errors import ImageInvalid, ImageNotFound
from pandastack.host.images.oci.manifest import (
    DOCKER_LIST,
    OCI_MANIFEST,
    media_type_of,
    parse_config,
    parse_manifest,
    pick_platform,
)

DIGEST = "sha256:" + "cd" * 32
IMAGE = "example/image:1"


def entry(os_: str, arch: str, variant: str | None = None,
          digest: str = DIGEST) -> dict[str, object]:
    platform = {"os": os_, "architecture": arch, **({"variant": variant} if variant else {})}
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": 10, "platform": platform}


def test_the_linux_amd64_entry_is_picked_past_attestations_and_other_platforms() -> None:
    amd64 = "sha256:" + "01" * 32
    index = json.dumps({"mediaType": DOCKER_LIST, "manifests": [
        entry("unknown", "unknown"), entry("linux", "arm64", "v8"), entry("windows", "amd64"),
        entry("linux", "amd64", digest=amd64)]}).encode()
    assert pick_platform(IMAGE, index).digest == amd64
    only_arm = json.dumps({"manifests": [entry("linux", "arm64")]}).encode()
    with pytest.raises(ImageNotFound, match="example/image:1: has no linux/amd64 image"):
        pick_platform(IMAGE, only_arm)


def test_manifests_are_checked_before_use() -> None:
    good: dict[str, Any] = {"config": {"mediaType": "x", "digest": DIGEST, "size": 2},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "digest": DIGEST, "size": 5}]}
    assert parse_manifest(IMAGE, json.dumps(good).encode()).layers[0].size == 5
    bad_digest = {**good, "layers": [{**good["layers"][0], "digest": "sha256:zz"}]}
    with pytest.raises(ImageInvalid, match="layer 0: digest"):
        parse_manifest(IMAGE, json.dumps(bad_digest).encode())
    zstd = {**good, "layers": [{**good["layers"][0],
                                "mediaType": "application/vnd.oci.image.layer.v1.tar+zstd"}]}
    assert parse_manifest(IMAGE, json.dumps(zstd).encode()).layers[0].media_type.endswith("zstd")
    foreign = {**good, "layers": [{**good["layers"][0], "mediaType":
                                   "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"}]}
    with pytest.raises(ImageInvalid, match=r"layer 0 is '[^']+foreign[^']+'; supported"):
        parse_manifest(IMAGE, json.dumps(foreign).encode())
    with pytest.raises(ImageInvalid, match="not JSON"):
        parse_manifest(IMAGE, b"<html>")
    with pytest.raises(ImageInvalid, match="unsupported manifest type"):
        media_type_of(IMAGE, json.dumps({"schemaVersion": 1}).encode(),
                      "application/vnd.docker.distribution.manifest.v1+prettyjws")


def test_the_config_gives_env_workdir_user_command_and_ports() -> None:
    body = json.dumps({"os": "linux", "architecture": "amd64", "config": {
        "Env": ["A=1", "B=x=y", "EMPTY="], "WorkingDir": "/srv", "User": "1000:1000",
        "Cmd": ["python3"], "ExposedPorts": {"80/tcp": {}}}}).encode()
    config = parse_config(IMAGE, body)
    assert config.env == (("A", "1"), ("B", "x=y"), ("EMPTY", ""))
    assert (config.working_dir, config.user) == ("/srv", "1000:1000")
    assert config.start_command == ("python3",)
    assert config.exposed_ports == ("80/tcp",)
    assert parse_config(IMAGE, b'{"os": "linux", "architecture": "amd64"}').env == ()
    with pytest.raises(ImageInvalid, match="built for linux/arm64"):
        parse_config(IMAGE, b'{"os": "linux", "architecture": "arm64"}')
    with pytest.raises(ImageInvalid, match="Cmd is not a list of strings"):
        parse_config(IMAGE, b'{"config": {"Cmd": [1, 2]}}')
