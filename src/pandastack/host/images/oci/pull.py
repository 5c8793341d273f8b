"""Pull an image into a root filesystem directory: resolve its manifest and config with the
caller's credentials, then each layer in order from the layer cache or the registry, applied
as it comes (ADR 0046)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.cache import LayerCache
from pandastack.host.images.oci.client import RegistryClient, ResolvedImage
from pandastack.host.images.oci.manifest import Descriptor
from pandastack.host.images.oci.reference import ImageReference, parse_reference
from pandastack.host.images.oci.settings import RegistrySettings
from pandastack.host.images.oci.unpack import UnpackBudget, UnpackReport, apply_layers

Progress = Callable[[str], None]
# Bytes of a layer as they arrive (digest, bytes so far, bytes in all): a CLI's progress bar.
LayerBytes = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PulledImage:
    image: ResolvedImage
    report: UnpackReport
    fetched: tuple[str, ...]  # digests read from the registry (the others came from the cache)
    unpacked_bytes: int  # file contents written


# A build's log says how far a layer's download is at most once per quarter of it or
# PROGRESS_INTERVAL_S, whichever comes first: a line per chunk would flood the log (a 50 MB
# layer is hundreds of chunks) while one line per layer says nothing during a slow pull.
PROGRESS_STEP = 0.25
PROGRESS_INTERVAL_S = 2.0
MIB = 1 << 20


def throttled_progress(progress: Progress, layers: Sequence[Descriptor], *,
                       clock: Callable[[], float] = time.monotonic) -> LayerBytes:
    """An `on_bytes` that writes `layer N/M sha256:...: 25 % (12.5 of 50.0 MiB)` lines to
    `progress`: when a layer's download crosses another quarter, or PROGRESS_INTERVAL_S after
    its last line, never twice for the same byte count."""
    numbers = {layer.digest: number for number, layer in enumerate(layers, 1)}
    last: dict[str, tuple[float, int, int]] = {}  # digest -> (when, quarter, bytes) of its line

    def on_bytes(digest: str, done: int, total: int) -> None:
        now = clock()
        quarter = int(done / total / PROGRESS_STEP) if total > 0 else 0
        when, shown, shown_bytes = last.get(digest, (now, 0, 0))
        if done == shown_bytes or (quarter <= shown and now - when < PROGRESS_INTERVAL_S):
            last.setdefault(digest, (when, shown, shown_bytes))
            return
        last[digest] = (now, quarter, done)
        percent = f"{100 * done // total} %" if total > 0 else "?"
        progress(f"layer {numbers.get(digest, '?')}/{len(layers)} {digest[:19]}: {percent} "
                 f"({done / MIB:.1f} of {total / MIB:.1f} MiB)")

    return on_bytes


def layer_cache(home: Path, settings: RegistrySettings) -> LayerCache:
    return LayerCache(home / "cache" / "oci", settings.layer_cache_bytes)


def _quiet(_: str) -> None:
    pass


def pull_image(reference: str | ImageReference, rootfs: Path, *, settings: RegistrySettings,
               cache: LayerCache, credentials: Credentials | None = None,
               progress: Progress = _quiet, on_bytes: LayerBytes | None = None) -> PulledImage:
    """Unpack `reference` into the (empty) directory `rootfs`."""
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    with RegistryClient(ref, settings, credentials) as client:
        return pull_resolved(client, client.resolve(), rootfs, cache=cache, settings=settings,
                             progress=progress, on_bytes=on_bytes)


def pull_resolved(client: RegistryClient, resolved: ResolvedImage, rootfs: Path, *,
                  cache: LayerCache, settings: RegistrySettings,
                  progress: Progress = _quiet, on_bytes: LayerBytes | None = None
                  ) -> PulledImage:
    """Unpack an image `client` resolved (its manifest fetched with the caller's credentials
    just now: only then may cached layers serve it) into `rootfs`."""
    ref = resolved.reference
    source = f"{ref.registry}/{ref.repository}"
    fetched: list[str] = []
    layers = resolved.manifest.layers
    progress(f"{ref}: {resolved.manifest_digest}, {len(layers)} layers, "
             f"{sum(layer.size for layer in layers)} bytes")

    def opened(number: int, layer: Descriptor) -> BinaryIO:
        blob = cache.open(layer.digest, source)
        if blob is not None:
            progress(f"layer {number}/{len(layers)} {layer.digest[:19]}: cached")
            return blob
        progress(f"layer {number}/{len(layers)} {layer.digest[:19]}: pulling "
                 f"{layer.size} bytes")
        fetched.append(layer.digest)

        def arrived(done: int, total: int) -> None:
            if on_bytes is not None:
                on_bytes(layer.digest, done, total)

        return cache.add(layer.digest, source,
                         lambda out: client.fetch_blob(layer, out, arrived))

    def blobs() -> Iterator[tuple[str, BinaryIO]]:
        for number, layer in enumerate(layers, 1):
            with opened(number, layer) as blob:
                yield f"{number}/{len(layers)} ({layer.digest[:19]})", blob

    budget = UnpackBudget(image=str(ref), max_bytes=settings.max_unpacked_bytes,
                          max_entries=settings.max_entries)
    report = apply_layers(blobs(), rootfs, budget)
    cache.evict(keep=[layer.digest for layer in layers])
    return PulledImage(image=resolved, report=report, fetched=tuple(fetched),
                       unpacked_bytes=budget.written)
