"""Spare network slots (host/runtime/slots.py): a fork asks for one spare per child, made
while its parent saves, and the runtime goes back to its usual number of spares after.
The network here is a stand-in that only counts: what `ip` and `nft` do is tested with real
namespaces in tests/host/network."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from pandastack.host.network.egress_proxy import EgressProxy
from pandastack.host.network.manager import NetworkManager, Slot
from pandastack.host.runtime.slots import SPARE_SLOTS, SandboxSlots
from pandastack.hostport.network import NetworkPolicy


class CountingNetwork:
    """Claims slots by number and remembers which were set up."""

    pool = "test"

    def __init__(self) -> None:
        self.claimed: dict[int, Path] = {}
        self.set_up: list[int] = []
        self._next = 0

    def claim(self, owner: Path) -> Slot:
        self._next += 1
        self.claimed[self._next] = owner
        return Slot(self._next, self.pool)

    def reassign(self, slot: Slot, owner: Path) -> None:
        self.claimed[slot.index] = owner

    def setup(self, slot: Slot, policy: NetworkPolicy) -> None:
        self.set_up.append(slot.index)

    def teardown(self, slot: Slot) -> None:
        self.set_up.remove(slot.index)

    def release(self, slot: Slot) -> None:
        del self.claimed[slot.index]


class NoProxy:
    async def attach(self, slot: Slot, policy: NetworkPolicy) -> None:
        return None

    async def detach(self, index: int) -> None:
        return None


def slots_on(network: CountingNetwork, tmp_path: Path) -> SandboxSlots:
    return SandboxSlots(cast(NetworkManager, network), cast(EgressProxy, NoProxy()),
                        tmp_path / "spares", progress=lambda message: None)


async def refilled(slots: SandboxSlots) -> None:
    """The refill under way, if any, has finished."""
    task = slots._refill
    if task is not None:
        await asyncio.wait_for(task, timeout=10)


async def test_a_fork_gets_a_spare_for_each_child_then_the_usual_number_is_kept(
        tmp_path: Path) -> None:
    network = CountingNetwork()
    slots = slots_on(network, tmp_path)
    slots.refill_spares()
    await refilled(slots)
    assert len(network.set_up) == SPARE_SLOTS
    slots.refill_spares(at_least=SPARE_SLOTS + 3)  # a fork of five children
    await refilled(slots)
    assert len(network.set_up) == SPARE_SLOTS + 3
    children = [await slots.acquire(tmp_path / f"child{i}", NetworkPolicy())
                for i in range(SPARE_SLOTS + 3)]
    # each child took a spare: none was set up on a child's own path
    assert len(network.set_up) == SPARE_SLOTS + 3
    assert {network.claimed[s.index] for s in children if s is not None} == \
        {tmp_path / f"child{i}" for i in range(SPARE_SLOTS + 3)}
    slots.refill_spares()  # after the fork, as every create does
    await refilled(slots)
    assert len(network.set_up) == SPARE_SLOTS * 2 + 3  # the usual spares, no more
    await slots.drop_spares()
    assert len(network.set_up) == SPARE_SLOTS + 3  # the children's slots


async def test_a_larger_wish_during_a_refill_is_taken_by_it(tmp_path: Path) -> None:
    network = CountingNetwork()
    slots = slots_on(network, tmp_path)
    slots.refill_spares()
    slots.refill_spares(at_least=SPARE_SLOTS + 2)  # while the first refill runs
    await refilled(slots)
    assert len(network.set_up) == SPARE_SLOTS + 2
    await slots.drop_spares()
    assert network.set_up == []
