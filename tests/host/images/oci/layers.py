"""Layers and OCI image layouts made by the tests (no other image source), pushed with skopeo."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import zstandard

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
BUSYBOX = Path("/bin/busybox")


@dataclass
class Entry:
    name: str
    data: bytes | None = None  # a regular file
    kind: bytes = tarfile.REGTYPE
    link: str = ""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    pax: dict[str, str] = field(default_factory=dict)


def file(name: str, data: bytes | str, mode: int = 0o644, **kw: object) -> Entry:
    return Entry(name, data.encode() if isinstance(data, str) else data, mode=mode,
                 **kw)  # type: ignore[arg-type]


def directory(name: str, mode: int = 0o755) -> Entry:
    return Entry(name, kind=tarfile.DIRTYPE, mode=mode)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, kind=tarfile.SYMTYPE, link=target, mode=0o777)


def hardlink(name: str, target: str) -> Entry:
    return Entry(name, kind=tarfile.LNKTYPE, link=target)


def device(name: str) -> Entry:
    return Entry(name, kind=tarfile.CHRTYPE, mode=0o666)


def tar_bytes(entries: list[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.kind
            info.mode = entry.mode
            info.uid, info.gid = entry.uid, entry.gid
            info.linkname = entry.link
            info.mtime = 1_700_000_000
            info.pax_headers = dict(entry.pax)
            if entry.kind == tarfile.CHRTYPE:
                info.devmajor, info.devminor = 1, 3
            data = entry.data or b""
            info.size = len(data) if entry.kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return out.getvalue()


def gzipped(entries: list[Entry]) -> bytes:
    return gzip.compress(tar_bytes(entries), mtime=0)


def zstded(entries: list[Entry], frames: Sequence[int] = ()) -> bytes:
    """A zstd layer as `zstd` writes it, or cut into frames at the `frames` offsets of the tar
    with a skippable frame between each (as zstd:chunked layers are)."""
    tar = tar_bytes(entries)
    cuts = [0, *frames, len(tar)]
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"meta"
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    return skippable.join(compressor.compress(tar[a:b]) for a, b in pairwise(cuts))


def busybox_layer() -> list[Entry]:
    return [directory("bin"), file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755),
            symlink("bin/sh", "busybox"), directory("etc"),
            file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n")]


def layer_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Layout:
    """An OCI image layout directory (`oci:` for skopeo)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.refs: list[dict[str, object]] = []

    def blob(self, data: bytes, media_type: str) -> dict[str, object]:
        digest = layer_digest(data)
        (self.path / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def blob_file(self, path: Path, media_type: str) -> dict[str, object]:
        """A large blob from a file: hard-linked into the layout (copied across devices)."""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        dest = self.path / "blobs" / "sha256" / digest.hexdigest()
        try:
            os.link(path, dest)
        except OSError:
            shutil.copyfile(path, dest)
        return {"mediaType": media_type, "digest": f"sha256:{digest.hexdigest()}",
                "size": path.stat().st_size}

    def manifest(self, layers: list[dict[str, object]], diff_ids: list[str],
                 config: dict[str, object] | None = None) -> dict[str, object]:
        config_blob = json.dumps({
            "architecture": "amd64", "os": "linux", "config": config or {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }).encode()
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": self.blob(config_blob, "application/vnd.oci.image.config.v1+json"),
                    "layers": layers}
        return self.blob(json.dumps(manifest).encode(), OCI_MANIFEST)

    def image(self, layers: list[bytes], config: dict[str, object] | None = None,
              architecture: str = "amd64") -> dict[str, object]:
        """A manifest of gzipped `layers` and a config with `config` as its Config."""
        descriptors = [self.blob(layer, LAYER_GZIP) for layer in layers]
        diff_ids = [layer_digest(gzip.decompress(layer)) for layer in layers]
        config_blob = json.dumps({
            "architecture": architecture, "os": "linux", "config": config or {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }).encode()
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": self.blob(config_blob, "application/vnd.oci.image.config.v1+json"),
                    "layers": descriptors}
        return self.blob(json.dumps(manifest).encode(), OCI_MANIFEST)

    def index(self, platforms: dict[str, dict[str, object]]) -> dict[str, object]:
        """A multi-architecture index of manifests by architecture."""
        manifests = [{**desc, "platform": {"os": "linux", "architecture": arch}}
                     for arch, desc in platforms.items()]
        body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.blob(json.dumps(body).encode(), OCI_INDEX)

    def tag(self, descriptor: dict[str, object], tag: str) -> str:
        self.refs.append({**descriptor,
                          "annotations": {"org.opencontainers.image.ref.name": tag}})
        (self.path / "index.json").write_text(json.dumps(
            {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.refs}))
        return f"oci:{self.path}:{tag}"


def skopeo_push(source: str, destination: str, policy: Path, *, creds: str | None = None,
                all_platforms: bool = False, compress_format: str | None = None) -> None:
    """Push as is, or with uncompressed layers compressed by skopeo (`zstd`: its encoder
    and manifest, as images in the wild have them; the digests are then skopeo's)."""
    argv = ["skopeo", "--policy", str(policy), "copy", "--quiet", "--dest-tls-verify=false"]
    argv += ["--dest-compress-format", compress_format] if compress_format \
        else ["--preserve-digests"]
    if all_platforms:
        argv.append("--all")
    if creds:
        argv += ["--dest-creds", creds]
    subprocess.run([*argv, source, f"docker://{destination}"], check=True, timeout=120,
                   capture_output=True)
