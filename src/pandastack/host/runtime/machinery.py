"""What every sandbox of a runtime is made with, set up once: the guest images, the
accelerator and VMM driver, and the template store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pandastack.host.config import HostConfig
from pandastack.host.file_modes import make_private
from pandastack.host.images.build import BASE, GuestImage, ensure_image, image_spec
from pandastack.host.memory.huge_pool import HugePagePool, host_memory_mb
from pandastack.host.network.manager import NetworkManager
from pandastack.host.templates.builtin import TemplateStore
from pandastack.host.vmm.driver import KernelSpec, VMMDriver
from pandastack.host.vmm.factory import driver_for
from pandastack.host.vmm.host_memory import reports_free_pages
from pandastack.hostport.errors import HostError

Progress = Callable[[str], None]
# Finds or builds the guest image of a variant (images.ImageSpec name); blocking.
ImageSource = Callable[[str, Progress], GuestImage]


class Machinery:
    """Set up by the first `prepare()`; every later call returns what it made."""

    def __init__(self, config: HostConfig, network: NetworkManager, huge_pool: HugePagePool,
                 pinned: Callable[[], list[Path]], progress: Progress,
                 images: ImageSource | None = None):
        """`pinned`: the templates garbage collection must keep although no VM runs them.
        `images`: where guest images come from (built under `config.home` by default)."""
        self.config = config
        self._find_image = images or self._build_image
        self.network = network
        self.huge_pool = huge_pool
        self.pinned = pinned
        self.progress = progress
        self._images: dict[str, GuestImage] = {}  # by variant (images.ImageSpec name)
        self._image_locks: dict[str, asyncio.Lock] = {}
        self._driver: VMMDriver | None = None
        self._templates: TemplateStore | None = None
        self._prepare_lock = asyncio.Lock()

    async def prepare(self) -> TemplateStore:
        """See `HostRuntime.prepare`."""
        async with self._prepare_lock:
            if self._templates is None:
                await asyncio.to_thread(make_private, self.config)
                image = await self.image(BASE, self.progress)
                kernel = KernelSpec(image.kernel, image.initrd, image.cmdline)
                balloon = await asyncio.to_thread(reports_free_pages)
                self.huge_pool.pages = self.config.stream_hugetlb_pages(
                    balloon, await asyncio.to_thread(host_memory_mb))
                # May boot the guest kernel once to probe the accelerator.
                self._driver = await asyncio.to_thread(driver_for, self.config.vmm, self.config,
                                                       kernel, reports_free_pages=balloon)
                self._templates = TemplateStore(
                    self.config.templates_dir, self._driver, self.image, pinned=self.pinned,
                    network=self.network if self.config.networking else None,
                    memory_stage=self.config.memory_stage_dir,
                    memory_stage_bytes=None if self.config.memory_stage_mb is None
                    else self.config.memory_stage_mb << 20,
                    kernel_args=self.config.guest_kernel_args(self._driver.accel))
            return self._templates

    async def image(self, variant: str, progress: Progress | None = None) -> GuestImage:
        """The guest image of a variant, built (or found in the cache) once per process."""
        spec = image_spec(variant)
        lock = self._image_locks.setdefault(variant, asyncio.Lock())
        async with lock:
            image = self._images.get(variant)
            if image is None:
                image = await asyncio.to_thread(self._find_image, spec.name,
                                                progress or self.progress)
                self._images[variant] = image
            return image

    def _build_image(self, variant: str, progress: Progress) -> GuestImage:
        return ensure_image(self.config.home, image_spec(variant), progress=progress)

    @property
    def driver(self) -> VMMDriver:
        if self._driver is None:
            raise HostError("runtime not prepared")
        return self._driver
