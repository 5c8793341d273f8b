"""What a guest does to itself stays in the guest: a fork bomb is contained, the agent keeps
answering, another sandbox does not notice. (Memory hogs and bombs: tests/server/
test_api_vm_abuse.py, through the API to this runtime, with the same checks and more.)"""

from __future__ import annotations

import pytest

from tests.helpers import SandboxFactory

# Fork and memory bombs hold both cores for seconds, and what is asserted has time bounds:
# the serial lane, so they neither slow nor are slowed by a second worker's VMs.
pytestmark = [pytest.mark.vm, pytest.mark.serial]


async def test_fork_bomb_is_contained(sandbox_factory: SandboxFactory) -> None:
    victim, bystander = await sandbox_factory(), await sandbox_factory()
    bomb = await victim.exec("b() { b | b & }; b; sleep 30", timeout=8)
    assert bomb.timed_out
    assert (await victim.exec("echo alive")).stdout == b"alive\n"
    left = await victim.exec("ps -e --no-headers | wc -l")
    assert int(left.stdout) < 100, "the bomb's processes were not all killed"
    assert (await bystander.exec("echo fine")).stdout == b"fine\n"

