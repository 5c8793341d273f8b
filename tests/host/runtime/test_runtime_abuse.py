"""What a guest does to itself stays in the guest: fork bombs and memory hogs are contained,
the agent keeps answering, other sandboxes and the host do not notice."""

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


async def test_memory_hog_is_killed_not_the_agent(sandbox_factory: SandboxFactory) -> None:
    sbx = await sandbox_factory()
    hog = await sbx.exec(["python3", "-c", "h = []\nwhile True: h.append(b'x' * (32 << 20))"],
                         timeout=120)
    assert hog.signal == 9, hog
    # It was the user-process cgroup's limit that struck, not the kernel's last resort.
    events = await sbx.exec("grep oom_kill /sys/fs/cgroup/pandastack/memory.events")
    assert int(events.stdout.split()[1]) >= 1, events.stdout
    assert (await sbx.exec("echo alive")).stdout == b"alive\n"
