"""Where a clone's first work goes under TCG: guest code translated, phase by phase.

Under TCG every restored QEMU process starts with an empty translation cache, so the guest
code a clone runs for the first time costs both time and memory (the translated-code buffer is
most of an idle sandbox's private memory). This restores one clone of `base` the floor's way
(bare restore, hand-made frames) with QEMU's `-d in_asm` log on, marks the log between phases
(restore + hello + ping, init, the first exec, idle, a second exec), and attributes each
phase's translated guest instructions to kernel areas (by the guest's own symbol table) or to
user space. A diagnostic, not a timing: the log itself slows the guest.

Usage: python bench/translation.py [--idle 20] [--top 15]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from common import temp_runtime
from pandastack.guestproto import frames as protocol
from pandastack.host.agentlink.handshake import InitParams
from pandastack.host.vmm.driver import VMPaths
from pandastack.host.vmm.qemu import QemuDriver
from pandastack.host.vmm.qemu.qcow2 import create_overlay
from pandastack.hostport.network import NetworkPolicy

# First matching pattern names the area of a kernel function (order matters).
AREAS: tuple[tuple[str, str], ...] = (
    ("disk (ext4, jbd2, block)", r"ext4|jbd2|blk|bio|virtblk|dd_|mpage|submit|buffer|journal"),
    ("random", r"chacha|blake2|crng|random|entropy|mix_pool"),
    ("time", r"clock|timekeep|hrtimer|timerfd|settime|vsyscall|tk_|ntp"),
    ("cgroups", r"cgroup|css|memcg|mem_cgroup|pids_|cpuset|psi_"),
    ("network", r"inet|ip6|ipv6|addrconf|neigh|rtnl|netlink|ndisc|arp|skb|udp|tcp|mld|xmit"),
    ("exec, fork, exit", r"exec|elf|copy_process|clone|do_exit|release_task|wait|bprm|dup_"),
    ("memory", r"page|folio|mm|vma|mas_|mt_|mtree|fault|pte|pmd|pgd|slab|kmem|alloc|free|tlb"),
    ("files (vfs, tmpfs)", r"path|dentry|inode|file|open|lookup|walk|shmem|vfs|namei|write|read"),
    ("scheduler, irq, rcu", r"sched|rcu|irq|wake|enqueue|dequeue|task|switch|timer|tick|idle"),
)
INSN = re.compile(rb"^0x([0-9a-f]+):", re.M)
KERNEL_BASE = 0xFFFF000000000000


class TracingDriver(QemuDriver):
    """The runtime's QEMU driver with the translated-code log on."""

    log: Path

    def _argv(self, *args: Any, **kwargs: Any) -> list[str]:
        return [*super()._argv(*args, **kwargs), "-d", "in_asm", "-D", str(self.log)]


class Symbols:
    def __init__(self, kallsyms: bytes) -> None:
        pairs = sorted((int(p[0], 16), p[2]) for p in (line.split() for line in
                       kallsyms.decode().splitlines()) if len(p) >= 3 and p[1] in "tTwW")
        self.addrs = [a for a, _ in pairs]
        self.names = [n for _, n in pairs]

    def area(self, addr: int) -> str:
        if addr < KERNEL_BASE:
            return "user space"
        name = self.names[max(0, bisect.bisect_right(self.addrs, addr) - 1)]
        return next((area for area, rx in AREAS if re.search(rx, name)), "kernel, other")


def attribute(log: bytes, symbols: Symbols) -> tuple[int, collections.Counter[str]]:
    """(translation blocks, guest instructions per area) of one slice of the log."""
    areas: collections.Counter[str] = collections.Counter()
    blocks = 0
    for block in log.split(b"IN:")[1:]:
        insns = INSN.findall(block)
        if insns:
            blocks += 1
            areas[symbols.area(int(insns[0], 16))] += len(insns)
    return blocks, areas


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    async with temp_runtime("psb-") as (rt, scratch):
        tmpl = await rt.ensure_template("base")
        # A clone of the same snapshot has the same kernel layout: read its symbol table.
        reader = await rt.create("base")
        symbols = Symbols(await reader.read_file_bytes("/proc/kallsyms"))
        await rt.kill(reader.id)
        assert isinstance(rt.driver, QemuDriver), "a QEMU driver is needed"
        tracer = TracingDriver.__new__(TracingDriver)
        tracer.__dict__.update(vars(rt.driver))
        tracer.log = scratch / "in_asm.log"
        workdir = scratch / "clone"
        workdir.mkdir(parents=True)
        slot = rt.network.claim(workdir)
        await asyncio.to_thread(rt.network.setup, slot, NetworkPolicy())
        create_overlay(workdir / "disk.qcow2", tmpl.disk, tmpl.disk_bytes)
        vm = await tracer.restore(VMPaths(workdir), tmpl.snapshot, workdir / "disk.qcow2",
                                  netns=slot.netns)
        marks: list[tuple[str, int]] = []
        try:
            sock = vm.agent_connection
            assert sock is not None
            sock.setblocking(True)
            init = InitParams(time.time_ns(), os.urandom(64), "trace",
                              secrets.token_hex(16)).frame(2)
            phases = [("restore, hello, ping", protocol.frame("hello", 0, v=1, nonce="t")
                       + protocol.frame("ping", 1), 3.0),
                      ("init", init, 3.0),
                      ("first exec (true)", protocol.frame("exec", 3, argv=["true"]), 5.0),
                      (f"idle {args.idle:.0f} s", b"", args.idle),
                      ("second exec (true)", protocol.frame("exec", 4, argv=["true"]), 4.0)]
            for label, frames, settle in phases:
                if frames:
                    sock.sendall(frames)
                await asyncio.sleep(settle)
                marks.append((label, tracer.log.stat().st_size))
        finally:
            vm.kill()
            await asyncio.to_thread(rt.network.teardown, slot)
            rt.network.release(slot)
        log = tracer.log.read_bytes()
    start = 0
    for label, end in marks:
        blocks, areas = attribute(log[start:end], symbols)
        start = end
        total = sum(areas.values())
        print(f"== {label}: {blocks} blocks, {total} guest instructions")
        for area, n in areas.most_common(args.top):
            print(f"   {n:7d}  {100 * n / max(total, 1):5.1f} %  {area}")


if __name__ == "__main__":
    asyncio.run(main())
