"""A guest image (kernel, initramfs, root disk) from an OCI image: the base image's kernel
and initramfs, and a root disk of the image's layers made bootable (guest_root.py). Cached
under the images cache by everything it is made of: the manifest's digest (the layers), the
base image, our agent, init and busybox."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pandastack.host.images.build import (
    BUSYBOX,
    ROOTFS_INIT_ASSET,
    ROOTFS_SIZE,
    GuestImage,
    Progress,
    guest_agent_binary,
    host_cmdline_extras,
    read_asset,
)
from pandastack.host.images.common import (
    atomic_dir,
    file_lock,
    hash_json,
    link_or_copy,
    run,
    sha256_bytes,
    sha256_file,
)
from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.client import RegistryClient, ResolvedImage
from pandastack.host.images.oci.guest_root import image_init, make_bootable
from pandastack.host.images.oci.pull import layer_cache, pull_resolved, throttled_progress
from pandastack.host.images.oci.reference import ImageReference, parse_reference
from pandastack.host.images.oci.settings import RegistrySettings
from pandastack.host.images.rootfs import ROOT_MKFS
from pandastack.hostport.errors import SetupError

# 2: image.json holds the image config's defaults; 3: its Entrypoint, Cmd and ExposedPorts too;
# 4: inode tables zeroed by mkfs (rootfs.ROOT_MKFS)
RECIPE = 4
# Room on the root disk beyond what the image unpacks to (the disk is sparse: unused room
# costs nothing on the host until written).
HEADROOM = 1 << 30


def _load(final: Path) -> GuestImage:
    meta = json.loads((final / "image.json").read_text())
    return GuestImage(key=meta["key"], kernel=final / meta["kernel"],
                      initrd=final / "initrd.img", rootfs=final / "rootfs.img",
                      kernel_version=meta["kernel_version"],
                      cmdline=meta["cmdline"] + host_cmdline_extras(),
                      variant=meta["variant"])


@dataclass(frozen=True)
class ImageDefaults:
    """What an image's config sets for the processes it runs (`docker inspect`'s Env,
    WorkingDir, User): a template built from it starts with them. Its Entrypoint and Cmd
    are the template's start command when the spec asks; ExposedPorts ("8080/tcp") are
    listed in the build's log and result."""

    env: dict[str, str]
    working_dir: str | None
    user: str | None
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    exposed_ports: tuple[str, ...] = ()


def image_defaults(image: GuestImage) -> ImageDefaults:
    """The config defaults of a guest image ensure_oci_image made."""
    meta = json.loads((image.rootfs.parent / "image.json").read_text())
    found = meta.get("defaults") or {}
    return ImageDefaults(env=dict(found.get("env") or {}),
                         working_dir=found.get("working_dir") or None,
                         user=found.get("user") or None,
                         entrypoint=tuple(found.get("entrypoint") or ()),
                         cmd=tuple(found.get("cmd") or ()),
                         exposed_ports=tuple(found.get("exposed_ports") or ()))


def ensure_oci_image(home: Path, reference: str | ImageReference, *, base: GuestImage,
                     settings: RegistrySettings, credentials: Credentials | None = None,
                     progress: Progress = print) -> GuestImage:
    """The guest image of `reference` as the registry names it now (its manifest is always
    asked for, with `credentials`: ADR 0046's access rule), built on first use."""
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    agent = guest_agent_binary()
    if agent is None:
        raise SetupError(f"image {ref}: images run the static guest agent (ADR 0038), not the "
                         "Python one")
    init = image_init(read_asset(ROOTFS_INIT_ASSET))
    images = home / "cache" / "images"
    with RegistryClient(ref, settings, credentials,
                        cache=layer_cache(home, settings)) as client:
        resolved = client.resolve()
        key = hash_json({"recipe": RECIPE, "manifest": resolved.manifest_digest,
                         "base": base.key, "agent": sha256_bytes(agent),
                         "init": sha256_bytes(init), "busybox": sha256_file(BUSYBOX)})[:32]
        final = images / key
        if (final / "image.json").exists():
            return _load(final)
        # The images cache's lock, as every image build holds it: its sweep of interrupted
        # builds' .tmp-* then never takes one of ours.
        with file_lock(home / "cache" / ".lock",
                       on_wait=lambda: progress("waiting for another image build")):
            if not (final / "image.json").exists():
                _build(client, resolved, final, home=home, base=base, agent=agent, init=init,
                       settings=settings, progress=progress)
    return _load(final)


def _build(client: RegistryClient, resolved: ResolvedImage, final: Path, *, home: Path,
           base: GuestImage, agent: bytes, init: bytes, settings: RegistrySettings,
           progress: Progress) -> None:
    ref = resolved.reference
    images = final.parent
    started = time.monotonic()
    images.mkdir(parents=True, exist_ok=True)
    with atomic_dir(final) as out, \
            tempfile.TemporaryDirectory(dir=images, prefix=".tmp-oci-root-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir(mode=0o755)
        pulled = pull_resolved(client, resolved, root, cache=layer_cache(home, settings),
                               settings=settings, progress=progress,
                               on_bytes=throttled_progress(progress, resolved.manifest.layers))
        make_bootable(root, agent_binary=agent, init_script=init, busybox=BUSYBOX)
        size = max(ROOTFS_SIZE, _round_mib(pulled.unpacked_bytes + HEADROOM))
        progress(f"image {ref}: mkfs.ext4 ({size >> 20} MiB sparse)")
        with (out / "rootfs.img").open("wb") as disk:
            disk.truncate(size)
        run([*ROOT_MKFS, "-d", root, out / "rootfs.img", f"{size // 1024}k"], what="mkfs.ext4")
        link_or_copy(base.initrd, out / "initrd.img")
        link_or_copy(base.kernel, out / base.kernel.name)
        meta = {"key": final.name, "variant": f"oci:{ref}", "image": str(ref),
                "digest": resolved.digest, "manifest_digest": resolved.manifest_digest,
                "kernel": base.kernel.name, "kernel_version": base.kernel_version,
                "cmdline": base.cmdline.removesuffix(host_cmdline_extras()),
                "base_key": base.key, "skipped": pulled.report.skipped,
                "defaults": {"env": dict(resolved.config.env),
                             "working_dir": resolved.config.working_dir,
                             "user": resolved.config.user,
                             "entrypoint": list(resolved.config.entrypoint),
                             "cmd": list(resolved.config.cmd),
                             "exposed_ports": list(resolved.config.exposed_ports)},
                "built_at": time.time()}
        for name in (base.kernel.name, "initrd.img", "rootfs.img"):
            os.chmod(out / name, 0o444)
        (out / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
    progress(f"image {ref}: guest image {final.name[:12]} ready in "
             f"{time.monotonic() - started:.1f} s")


def _round_mib(size: int) -> int:
    return (size + (1 << 20) - 1) & ~((1 << 20) - 1)
