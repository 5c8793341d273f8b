"""The network slots of a runtime's sandboxes: a few spares kept ready, and the egress proxy
attached to each slot whose policy needs it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

from pandastack.host.network.egress_proxy import EgressProxy
from pandastack.host.network.manager import NetworkManager, Slot
from pandastack.host.runtime.records import SandboxRecord
from pandastack.hostport.errors import HostError
from pandastack.hostport.network import NetworkPolicy
from pandastack.tracing import traced

# Network slots kept ready (namespace, veth, tap, default policy), so that a create does not
# wait ~20 ms for `ip` and `nft`. They hold no VM: nothing idles but a few kernel objects.
SPARE_SLOTS = 2

Progress = Callable[[str], None]


class SandboxSlots:
    """Claims, sets up and frees network slots for sandboxes, from spares when there are."""

    def __init__(self, network: NetworkManager, egress: EgressProxy, spare_owner: Path,
                 progress: Progress, *, enabled: bool = True):
        """`spare_owner`: the path the spare slots are claimed for (no sandbox's). Not
        `enabled` (HostConfig.networking off): no sandbox gets a slot, and the host's
        network is never touched, not even swept."""
        self.enabled = enabled
        self.network = network
        self.egress = egress
        self.spare_owner = spare_owner
        self.progress = progress
        self._spares: list[Slot] = []
        self._refill: asyncio.Task[None] | None = None
        self._wanted = SPARE_SLOTS  # spares the refill under way makes
        self._closing = False

    def slot(self, index: int) -> Slot:
        return Slot(index, self.network.pool)

    @traced("runtime.network_slot")
    async def acquire(self, owner: Path, policy: NetworkPolicy) -> Slot | None:
        """A slot for the sandbox directory `owner`, with `policy` in force; None without
        networking."""
        if not self.enabled:
            return None
        if self._spares:
            slot = self._spares.pop()
            self.network.reassign(slot, owner)
            if policy != NetworkPolicy():
                try:
                    await asyncio.to_thread(self.network.update, slot, policy)
                except BaseException:
                    await asyncio.to_thread(self.free, slot)
                    raise
        else:
            slot = self.network.claim(owner)
            await asyncio.to_thread(self.network.setup, slot, policy)
        try:
            await self.egress.attach(slot, policy)
        except BaseException:
            await self.release(slot)
            raise
        return slot

    async def change(self, slot: Slot, policy: NetworkPolicy, previous: NetworkPolicy) -> None:
        """Put `policy` in force instead of `previous`, for new connections at once."""
        # The proxy listens (and judges by the new policy) before the namespace redirects to
        # it, and stops only once nothing does.
        await self.egress.attach(slot, policy)
        try:
            await asyncio.to_thread(self.network.update, slot, policy)
        except BaseException:
            await self.egress.attach(slot, previous)
            raise
        if not policy.needs_proxy:
            await self.egress.detach(slot.index)

    async def reattach(self, records: Iterable[SandboxRecord]) -> None:
        """After a restart: adopted sandboxes' namespaces still send ports 80/443 to the
        proxy, so it must listen again. The rules are written again too, in case the proxy
        ports (or this code) changed."""
        for record in records:
            if record.slot is None:
                continue
            try:
                policy = NetworkPolicy.from_dict(record.network)
                await self.egress.attach(self.slot(record.slot), policy)
                if policy.needs_proxy:
                    await asyncio.to_thread(self.network.update, self.slot(record.slot),
                                            policy)
            except (HostError, ValueError) as exc:  # its ports 80/443 stay closed
                self.progress(f"egress proxy for {record.id}: {exc}")

    async def release(self, slot: Slot) -> None:
        await self.egress.detach(slot.index)
        await asyncio.to_thread(self.free, slot)

    def free(self, slot: Slot) -> None:
        self.network.teardown(slot)
        self.network.release(slot)

    async def sweep(self) -> None:
        """At start: free the slots of sandboxes (of any runtime on this host) whose directory
        is gone, and the spares a crashed predecessor left."""
        if not self.enabled:
            return
        self.spare_owner.unlink(missing_ok=True)
        await asyncio.to_thread(self.network.sweep)

    def refill_spares(self, at_least: int = SPARE_SLOTS) -> None:
        """Prepare spares in the background until there are `at_least` (a fork asks for one
        per child); a refill under way takes the larger wish."""
        if not self.enabled:
            return
        self._wanted = max(self._wanted, at_least)
        if self._refill is not None and not self._refill.done():
            return

        async def refill() -> None:
            try:
                await fill()
            finally:
                self._wanted = SPARE_SLOTS

        async def fill() -> None:
            while len(self._spares) < self._wanted and not self._closing:
                self.spare_owner.touch()
                slot = self.network.claim(self.spare_owner)
                try:
                    await asyncio.to_thread(self.network.setup, slot, NetworkPolicy())
                except HostError as exc:
                    self.network.release(slot)
                    self.progress(f"cannot prepare a network slot: {exc}")
                    return
                self._spares.append(slot)

        self._refill = asyncio.get_running_loop().create_task(refill(), name="network-spares")

    async def drop_spares(self) -> None:
        # Let a slot being prepared finish (its `ip`/`nft` run in a thread that a cancel
        # would not stop), then tear every spare down.
        self._closing = True
        if self._refill is not None:
            with contextlib.suppress(Exception):
                await self._refill
        self._closing = False
        while self._spares:
            await asyncio.to_thread(self.free, self._spares.pop())
        self.spare_owner.unlink(missing_ok=True)
