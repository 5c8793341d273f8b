"""A template build FROM an OCI image (issue 37, ADR 0046): the image becomes a guest image
(images/oci/guest_image.py: its manifest asked for every time, so a build reads nothing else
from the registry once its layers are cached), that one a template of the store (baked once
per image, shape and agent), and the build's steps run in a sandbox of it, starting from the
image config's Env, WorkingDir and User."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path

from pandastack.host.images.build import BASE, Progress
from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.client import RegistryClient
from pandastack.host.images.oci.guest_image import ImageDefaults, ensure_oci_image, image_defaults
from pandastack.host.images.oci.pull import layer_cache
from pandastack.host.images.oci.reference import parse_reference
from pandastack.host.images.oci.settings import RegistrySettings
from pandastack.host.runtime import HostRuntime
from pandastack.host.vmm.driver import MachineShape
from pandastack.hostport.registries import RegistryLogins
from pandastack.hostport.results import ImageInfo
from pandastack.templatespec.base import base_kind

#: The store's templates made from images are named so: never a built-in's or a team's
#: (those are snapshots on the host), one per guest image.
IMAGE_TEMPLATE_PREFIX = "oci-"
#: A build request FROM an image waits for the registry's answer about it (`inspect_image`)
#: this long at most; the build's own pull then has the settings' deadline (120 s).
INSPECT_DEADLINE_S = 20.0


@dataclass(frozen=True)
class ImageBase:
    template: str  # the store's template of the image: creates of it restore the image
    template_key: str
    defaults: ImageDefaults
    # The guest disk image's allocated bytes: each template built FROM the image counts it.
    disk_bytes: int = 0


def allocated_file_bytes(path: Path) -> int:
    """Bytes `path` takes on disk (a sparse rootfs: its blocks, not its length)."""
    return path.stat().st_blocks * 512


def is_image(base: str) -> bool:
    """Whether a spec's base (as the control plane hands it over: built-in names and
    snapshot:<id> for templates) is an image."""
    return base_kind(base) == "image"


async def ensure_image_base(runtime: HostRuntime, reference: str, shape: MachineShape,
                            progress: Progress, *,
                            logins: RegistryLogins | None = None) -> ImageBase:
    """`logins` (a team's, by registry): the manifest is asked for with the one of the
    image's registry, every time, so a team reaches cached layers of a private image only
    through its own access to it (ADR 0046's rule)."""
    ref = parse_reference(reference)
    store = await runtime.prepare()
    base = await runtime.machinery.image(BASE)
    settings = RegistrySettings.from_env()
    login = (logins or {}).get(ref.registry)
    credentials = None if login is None else Credentials(login.username, login.password)
    loop = asyncio.get_running_loop()

    def from_worker(line: str) -> None:
        # The pull runs in a worker thread; a build log wakes its followers on the loop's.
        loop.call_soon_threadsafe(progress, line)

    image = await asyncio.to_thread(ensure_oci_image, runtime.config.home, ref,
                                    base=base, settings=settings, credentials=credentials,
                                    progress=from_worker)
    name = IMAGE_TEMPLATE_PREFIX + image.key[:16]
    template = await store.ensure_image(name, image, shape, progress=progress)
    return ImageBase(template=name, template_key=template.key,
                     defaults=await asyncio.to_thread(image_defaults, image),
                     disk_bytes=await asyncio.to_thread(allocated_file_bytes, image.rootfs))



def inspect_image(reference: str, settings: RegistrySettings | None = None, *,
                  logins: RegistryLogins | None = None, home: Path | None = None) -> ImageInfo:
    """The registry's manifest and config of `reference` (no layer is fetched), asked with
    the login `logins` has for its registry, within INSPECT_DEADLINE_S: a silent registry's
    single request stalls half of it at most, so the answer or a RegistryUnavailable comes
    before the control plane's wait for it ends. `home`: the host's, whose layer cache
    keeps the config, so a rebuild FROM a cached image asks this lookup for its manifest
    only, as the build's own pull (ensure_oci_image) does."""
    settings = settings if settings is not None else RegistrySettings.from_env()
    deadline = min(settings.deadline_s, INSPECT_DEADLINE_S)
    quick = replace(settings, deadline_s=deadline,
                    timeout_s=min(settings.timeout_s, deadline / 2))
    ref = parse_reference(reference)
    login = (logins or {}).get(ref.registry)
    credentials = None if login is None else Credentials(login.username, login.password)
    cache = None if home is None else layer_cache(home, settings)
    with RegistryClient(ref, quick, credentials, cache=cache) as client:
        resolved = client.resolve()
    layers = resolved.manifest.layers
    return ImageInfo(reference=str(ref), digest=resolved.digest,
                     manifest_digest=resolved.manifest_digest, layers=len(layers),
                     size=sum(layer.size for layer in layers),
                     exposed_ports=tuple(resolved.config.exposed_ports))
