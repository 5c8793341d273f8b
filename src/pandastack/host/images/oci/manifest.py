"""Manifests, indexes and image configs: the JSON a registry serves, parsed into what a pull
and a template build need (media types of the OCI image spec and Docker's schema 2)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pandastack.host.images.oci.errors import ImageInvalid, ImageNotFound

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*MANIFEST_TYPES, *INDEX_TYPES))
# Layer media types we unpack; the compression itself is read from the blob's first bytes.
# Docker's schema 2 has no zstd type of its own: Docker writes the OCI one in its manifests.
LAYER_TYPES = frozenset({
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
})
PLATFORM = ("linux", "amd64")
MAX_CONFIG_ITEMS = 4096
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int


@dataclass(frozen=True)
class ImageManifest:
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config a template honours (`docker inspect`'s Config)."""

    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = ""
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    exposed_ports: tuple[str, ...] = ()  # "8080/tcp"
    diff_ids: tuple[str, ...] = ()

    @property
    def start_command(self) -> tuple[str, ...]:
        return self.entrypoint + self.cmd


def _json(image: str, body: bytes, what: str) -> dict[str, object]:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageInvalid(image, f"its {what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImageInvalid(image, f"its {what} is not a JSON object")
    return value


def _descriptor(image: str, raw: object, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise ImageInvalid(image, f"{what}: not a descriptor")
    media, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ImageInvalid(image, f"{what}: digest {digest!r} is not sha256:<64 hex>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageInvalid(image, f"{what}: size {size!r} is not a byte count")
    return Descriptor(media_type=media if isinstance(media, str) else "", digest=digest,
                      size=size)


def media_type_of(image: str, body: bytes, header: str) -> str:
    """The manifest's media type: its own field, else the Content-Type the registry sent."""
    declared = _json(image, body, "manifest").get("mediaType")
    media = declared if isinstance(declared, str) and declared else header.split(";")[0].strip()
    if media not in INDEX_TYPES and media not in MANIFEST_TYPES:
        raise ImageInvalid(image, f"unsupported manifest type {media or '(none)'!r} (schema 1 "
                                  "and artifacts are not images we can run)")
    return media


def pick_platform(image: str, body: bytes) -> Descriptor:
    """The linux/amd64 manifest of an index (attestations and other platforms skipped)."""
    entries = _json(image, body, "index").get("manifests")
    if not isinstance(entries, list):
        raise ImageInvalid(image, "its index has no manifests list")
    for number, raw in enumerate(entries):
        if not isinstance(raw, dict):
            continue
        platform = raw.get("platform")
        if not isinstance(platform, dict):
            continue
        if (platform.get("os"), platform.get("architecture")) == PLATFORM \
                and platform.get("variant") in (None, "", "v1"):
            found = _descriptor(image, raw, f"index entry {number}")
            if found.media_type not in MANIFEST_TYPES:
                raise ImageInvalid(image, f"its linux/amd64 entry is a {found.media_type!r}")
            return found
    raise ImageNotFound(image, "has no linux/amd64 image in its index")


def parse_manifest(image: str, body: bytes) -> ImageManifest:
    raw = _json(image, body, "manifest")
    config = _descriptor(image, raw.get("config"), "config")
    layers_raw = raw.get("layers")
    if not isinstance(layers_raw, list):
        raise ImageInvalid(image, "its manifest has no layers list")
    layers = tuple(_descriptor(image, item, f"layer {n}") for n, item in enumerate(layers_raw))
    for n, layer in enumerate(layers):
        if layer.media_type not in LAYER_TYPES:
            raise ImageInvalid(image, f"layer {n} is {layer.media_type!r}; supported: "
                                      f"{', '.join(sorted(LAYER_TYPES))}")
    return ImageManifest(config=config, layers=layers)


def _strings(image: str, value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # Docker accepts a shell-form string for Cmd/Entrypoint
        return ("/bin/sh", "-c", value)
    if not isinstance(value, list) or len(value) > MAX_CONFIG_ITEMS \
            or not all(isinstance(v, str) for v in value):
        raise ImageInvalid(image, f"config {what} is not a list of strings")
    return tuple(value)


def parse_config(image: str, body: bytes) -> ImageConfig:
    raw = _json(image, body, "config")
    if (raw.get("os"), raw.get("architecture")) not in (PLATFORM, (None, None)):
        raise ImageInvalid(image, f"is built for {raw.get('os')}/{raw.get('architecture')}, "
                                  "not linux/amd64")
    conf = raw.get("config") or {}
    if not isinstance(conf, dict):
        raise ImageInvalid(image, "its config's config is not an object")
    env: list[tuple[str, str]] = []
    for item in _strings(image, conf.get("Env") or [], "Env"):
        key, _, value = item.partition("=")
        if key:
            env.append((key, value))
    ports = conf.get("ExposedPorts") or {}
    if not isinstance(ports, dict):
        raise ImageInvalid(image, "config ExposedPorts is not an object")
    rootfs = raw.get("rootfs") or {}
    diff_ids = _strings(image, rootfs.get("diff_ids") if isinstance(rootfs, dict) else None,
                        "rootfs.diff_ids")
    for key in ("WorkingDir", "User"):
        if not isinstance(conf.get(key) or "", str):
            raise ImageInvalid(image, f"config {key} is not a string")
    return ImageConfig(
        env=tuple(env),
        working_dir=str(conf.get("WorkingDir") or ""),
        user=str(conf.get("User") or ""),
        entrypoint=_strings(image, conf.get("Entrypoint"), "Entrypoint"),
        cmd=_strings(image, conf.get("Cmd"), "Cmd"),
        exposed_ports=tuple(sorted(str(p) for p in ports)[:MAX_CONFIG_ITEMS]),
        diff_ids=diff_ids,
    )
