"""A sandbox's disk is a chain of copy-on-write layers over its template's (in its driver's
format, `DiskLayers`), one more for each snapshot or fork. Past MAX_LAYERS, the layers below
the top are merged into it in the background, by its VMM, while the sandbox runs; this keeps
the merges under way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from pandastack.host.vmm.driver import Capability, VMMDriver, VMProcess

# Each layer made every later save's pause ~0.3 ms longer (the VMM reopened the whole chain
# at `cont`: 2.5 ms at 2 layers, 20.7 ms at 62) and every restore open one more file.
MAX_LAYERS = 8
# How long a snapshot waits for a merge under way before cancelling it (the merge then
# starts again after that snapshot).
FLATTEN_WAIT_S = 1.0

Progress = Callable[[str], None]


def needs_merge(layers: tuple[str, ...]) -> bool:
    """Whether a chain of `layers`, once a snapshot has added one, should be merged."""
    return len(layers) + 1 > MAX_LAYERS


class LayerMerges:
    """The merges under way: per sandbox, its layers as the merge began and the template
    disk the merge goes down to."""

    def __init__(self, driver: Callable[[], VMMDriver], progress: Progress):
        self._driver = driver
        self.progress = progress
        self._under_way: dict[str, tuple[tuple[str, ...], Path]] = {}

    def under_way(self, sandbox_id: str) -> bool:
        return sandbox_id in self._under_way

    async def start(self, sandbox_id: str, vm: VMProcess, layers: tuple[str, ...],
                    base: Callable[[], Awaitable[Path]]) -> None:
        """Start merging `layers` (all but the top) into the top; `base` finds the template
        disk below them. A merge that cannot start is reported: the chain only stays long.
        So does a driver that cannot merge (without `Capability.LAYER_FLATTENING`)."""
        if Capability.LAYER_FLATTENING not in self._driver().capabilities:
            return
        try:
            disk = await base()
            await self._driver().disks.start_flatten(vm, disk)
        except Exception as exc:
            self.progress(f"cannot merge the disk layers of {sandbox_id}: {exc}")
            return
        self._under_way[sandbox_id] = (layers, disk)

    async def settle(self, sandbox_id: str, vm: VMProcess) -> tuple[str, ...] | None:
        """End the merge under way (waiting FLATTEN_WAIT_S at most): the layers it began with
        if it merged them all into the top, else None."""
        merging = self._under_way.pop(sandbox_id, None)
        if merging is None:
            return None
        layers, base = merging
        try:
            merged = await self._driver().disks.settle_flatten(vm, base, FLATTEN_WAIT_S)
        except Exception as exc:
            self.progress(f"cannot end the merge of {sandbox_id}'s disk layers: {exc}")
            return None
        return layers if merged else None

    def forget(self, sandbox_id: str) -> None:
        self._under_way.pop(sandbox_id, None)

    def clear(self) -> None:
        self._under_way.clear()
