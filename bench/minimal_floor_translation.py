"""What our guest translates after a restore against what the minimal floor's guest does
(bench/minimal_floor.py), phase by phase: the instructions of the gap docs/benchmarks-floor.md
attributes to our agent's first use.

Under TCG every restore starts with an empty translation cache, so the guest code run for the
first time after it is the cost. Both guests are restored once with QEMU's `-d in_asm` log
on, and the log is marked between phases (bench/translation.py's way: the phase's requests
sent, a settle, the log's size noted):

- the minimal guest: resume and one answer; the clock, entropy and hostname parts of `init`;
  the first `/bin/sh -c true`; a second one;
- ours, restored as the driver floor does: hello and ping; `init`; the first exec of
  `/bin/sh -c true`; a second one.

Each phase's translated guest instructions are split into user space and kernel; ours also
by kernel area (its clones share the template's symbol table). A diagnostic, not a timing:
the log slows the guest.

Usage: python bench/minimal_floor_translation.py [--top 8]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import temp_runtime
from minimal_floor import Floor, bake, build_initrd, request, spawn
from pandastack.guestproto import frames as protocol
from pandastack.host.agentlink.handshake import InitParams
from pandastack.host.runtime import HostRuntime
from pandastack.host.templates.builtin import Template
from pandastack.host.vmm.driver import VMPaths, connect_unix
from pandastack.host.vmm.qemu.driver import QemuDriver
from pandastack.host.vmm.qemu.qcow2 import create_overlay
from pandastack.host.vmm.qemu.qmp import qmp_pipeline
from pandastack.hostport.network import NetworkPolicy
from translation import INSN, KERNEL_BASE, Symbols, TracingDriver, attribute

SH_TRUE = ["/bin/sh", "-c", "true"]
Marks = list[tuple[str, int]]


def in_asm(log: Path) -> list[str]:
    return ["-d", "in_asm", "-D", str(log)]


async def minimal_phases(floor: Floor, workdir: Path) -> tuple[bytes, Marks]:
    workdir.mkdir()
    log = workdir / "in_asm.log"
    fd = os.open(floor.device_state, os.O_RDONLY | os.O_CLOEXEC)
    proc = spawn([*floor.argv(workdir, share=False), "-incoming", "defer", *in_asm(log)],
                 workdir, (fd,))
    marks: Marks = []
    try:
        def alive() -> bool:
            return proc.poll() is None
        sock = await connect_unix(workdir / "agent.sock", alive=alive)
        await qmp_pipeline(workdir / "qmp.sock", [
            ("migrate-set-capabilities", {"capabilities": [
                {"capability": "x-ignore-shared", "state": True}]}),
            ("migrate-incoming", {"uri": f"fd:{fd}"}),
        ], alive=alive)
        for label, what, settle in (("restore, one answer", b"p", 3.0),
                                    ("clock, entropy, hostname", b"crh", 3.0),
                                    ("first exec (sh -c true)", b"x", 3.0),
                                    ("second exec", b"x", 3.0)):
            if request(sock, what=what) != 0:
                raise RuntimeError(f"the floor's {what!r} failed")
            await asyncio.sleep(settle)
            marks.append((label, log.stat().st_size))
        sock.close()
    finally:
        os.close(fd)
        proc.kill()
        proc.wait()
    return log.read_bytes(), marks


async def our_phases(rt: HostRuntime, tracer: TracingDriver, tmpl: Template, workdir: Path
                     ) -> tuple[bytes, Marks]:
    workdir.mkdir(parents=True)
    tracer.log = workdir / "in_asm.log"
    slot = rt.network.claim(workdir)
    await asyncio.to_thread(rt.network.setup, slot, NetworkPolicy())
    create_overlay(workdir / "disk.qcow2", tmpl.disk, tmpl.disk_bytes)
    vm = await tracer.restore(VMPaths(workdir), tmpl.snapshot, workdir / "disk.qcow2",
                              netns=slot.netns)
    marks: Marks = []
    try:
        sock = vm.agent_connection
        assert sock is not None
        sock.setblocking(True)
        init = InitParams(time.time_ns(), os.urandom(64), "trace",
                          secrets.token_hex(16)).frame(2)
        for label, frames, settle in (
                ("restore, hello, ping",
                 protocol.frame("hello", 0, v=1, nonce="t") + protocol.frame("ping", 1), 3.0),
                ("init", init, 3.0),
                ("first exec (sh -c true)", protocol.frame("exec", 3, argv=SH_TRUE), 3.0),
                ("second exec", protocol.frame("exec", 4, argv=SH_TRUE), 3.0)):
            sock.sendall(frames)
            await asyncio.sleep(settle)
            marks.append((label, tracer.log.stat().st_size))
    finally:
        vm.kill()
        await asyncio.to_thread(rt.network.teardown, slot)
        rt.network.release(slot)
    return tracer.log.read_bytes(), marks


def split(log: bytes) -> tuple[int, int]:
    """(user space, kernel) guest instructions of one slice of the log."""
    user = kernel = 0
    for block in log.split(b"IN:")[1:]:
        insns = INSN.findall(block)
        if insns:
            if int(insns[0], 16) < KERNEL_BASE:
                user += len(insns)
            else:
                kernel += len(insns)
    return user, kernel


def show(title: str, log: bytes, marks: Marks, symbols: Symbols | None, top: int) -> None:
    print(f"\n{title}: guest instructions translated (thousands), user space + kernel")
    start = 0
    for label, end in marks:
        user, kernel = split(log[start:end])
        print(f"  {label:28s} {(user + kernel) / 1000:7.1f} k = {user / 1000:6.1f} k user "
              f"+ {kernel / 1000:6.1f} k kernel")
        if symbols is not None:
            areas: collections.Counter[str] = attribute(log[start:end], symbols)[1]
            del areas["user space"]
            for area, n in areas.most_common(top):
                print(f"  {'':28s} {n / 1000:7.1f} k  {area}")
        start = end


async def main(top: int) -> None:
    async with temp_runtime("minimal-floor-tr-") as (rt, scratch):
        driver = rt.driver
        assert isinstance(driver, QemuDriver), "a QEMU driver is needed"
        tmpl = await rt.ensure_template("base")
        reader = await rt.create("base")
        symbols = Symbols(await reader.read_file_bytes("/proc/kallsyms"))
        await rt.kill(reader.id)
        tracer = TracingDriver.__new__(TracingDriver)
        tracer.__dict__.update(vars(driver))
        shm = Path(tempfile.mkdtemp(prefix="pandastack-minimal-floor-", dir="/dev/shm"))
        try:
            floor = await bake(driver, tmpl, build_initrd(tmpl.snapshot.kernel.initrd),
                               shm / "minimal")
            minimal = await minimal_phases(floor, shm / "traced")
        finally:
            shutil.rmtree(shm, ignore_errors=True)
        ours = await our_phases(rt, tracer, tmpl, scratch / "ours")
    show("minimal guest (bench/minimal_floor_agent.c)", *minimal, None, top)
    show("our guest (our agent, the driver floor's way)", *ours, symbols, top)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    if Path("/tmp/pandastack-quiet").exists():
        print("/tmp/pandastack-quiet exists: a timing CI run is on; not running", file=sys.stderr)
        sys.exit(1)
    asyncio.run(main(args.top))
