"""Experiment (issue 36, target 4): fork children that map the parent's memory from a file
instead of each loading the whole stream into anonymous memory.

The parent (~200 MB of dirty memory, and a process holding a random value) is saved as a
fork saves it (`Saves.snapshot`, internal and transient: the fork buffer, the stopped save);
the stream is then split (bench/fork_map_stream.py) into a raw RAM file on tmpfs (zero pages
are holes) and a stream without those pages. Children are made by the runtime's own
`create(snapshot=...)` (network slot, layers, handshake, `init`); only the files handed to
the VMM's restore differ: the raw file as the memory file (mapped `share=off`, as a template
clone maps its template's) and the split stream as the device state. Each child must answer
the holder's value (SIGUSR1, /tmp/told) as the parent does.

Each round, interleaved: a create from the template to its first exec; for each count, the
runtime's fork (until it returns, then each child's first exec) and the mapped fork (save,
split, the children restored concurrently, each to its first exec). p50 over the rounds.

Usage: python bench/fork_map.py [--n 5] [--dirty-mb 200] [--counts 1,3]
                             [--variants shm-py,shm-c,shm-pipe]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import line as _line
from common import pct, settle_fork_machinery, temp_runtime
from fork import make_dirty
from fork_map_stream import Split, build_c, split_stream, split_stream_c
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import SnapshotFiles
from pandastack.host.vmm.qemu import save as qemu_save
from pandastack.host.vmm.qemu.qmp import send_fd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*
from tests.helpers import holder_value, start_holder

MIB = 1 << 20


def pss_mib(pid: int | None) -> float:
    """The VMM's proportional set size (pages shared with other children count by share)
    plus its hugetlb pages (a stream restore's RAM from the pool, which Pss leaves out)."""
    kib = 0
    for row in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if row.startswith(("Pss:", "Private_Hugetlb:", "Shared_Hugetlb:")):
            kib += int(row.split()[1])
    return kib / 1024


def line(label: str, values: list[float], unit: str) -> str:
    return _line(label, values, unit, width=50)


class MappedRestores:
    """The runtime's restore, with the files of a split stream where one is registered for
    the snapshot stream being restored (a bench-only hook: the runtime has no such path)."""

    def __init__(self, rt: HostRuntime) -> None:
        self.by_stream: dict[Path, tuple[Path, Path]] = {}
        self.inner = rt.restore_vm

        async def restore_vm(paths: Any, files: SnapshotFiles, *rest: Any) -> Any:
            mapped = self.by_stream.get(files.device_state)
            if mapped is not None:
                files = dataclasses.replace(files, device_state=mapped[0], memory=mapped[1])
            return await self.inner(paths, files, *rest)

        setattr(rt, "restore_vm", restore_vm)  # noqa: B010  (mypy: a method assigned)


@dataclasses.dataclass
class Figures:
    values: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    blocks: dict[str, int] = dataclasses.field(default_factory=dict)
    sizes: dict[str, float] = dataclasses.field(default_factory=dict)  # the last round's

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)


async def first_exec(kid: SandboxHandle) -> float:
    t0 = time.perf_counter()
    await kid.exec(["true"])
    return (time.perf_counter() - t0) * 1000


async def current_fork(rt: HostRuntime, parent: SandboxHandle, count: int, holder: tuple[int, str],
                       fig: Figures) -> None:
    t0 = time.perf_counter()
    kids = await rt.fork(parent.id, count=count)
    returned = time.perf_counter()
    await asyncio.gather(*(first_exec(k) for k in kids))
    done = time.perf_counter()
    k = f"fork{count}"
    fig.add(f"{k} pause", kids.parent_pause_ms or 0.0)
    fig.add(f"{k} until it returns", (returned - t0) * 1000)
    fig.add(f"{k} until it returns, per child", (returned - t0) * 1000 / count)
    fig.add(f"{k} to every child's 1st exec", (done - t0) * 1000)
    for kid in kids:
        fig.add(f"{k} child VMM PSS+hugetlb MiB (after 1st exec)", pss_mib(kid.pid))
    for kid in kids:
        got = await holder_value(kid, holder[0])
        if got != holder[1]:
            raise RuntimeError(f"fork child {kid.id} holds {got!r}, not {holder[1]!r}")
        await rt.kill(kid.id)


class StreamSink:
    """While `fifo` is set, the next save's stream goes into that FIFO (a splitter reads it)
    instead of the file the runtime names (bench-only: the runtime has no such path). The
    file is still made, empty, so the save's rename or link finds it."""

    def __init__(self) -> None:
        self.fifo: Path | None = None
        self.ours: set[int] = set()
        inner_pass, inner_written = qemu_save.pass_stream_fd, qemu_save.stream_written

        async def pass_stream_fd(qmp: Any, path: Path, *, reserve: int = 0,
                                 truncate: bool = True) -> int:
            if self.fifo is None:
                return await inner_pass(qmp, path, reserve=reserve, truncate=truncate)
            path.touch()
            fd = os.open(self.fifo, os.O_WRONLY | os.O_CLOEXEC)  # the splitter reads it
            try:
                kept = os.dup(fd)
                send_fd(qmp, fd)
                await qmp.execute("getfd", {"fdname": qemu_save.STREAM_FD_NAME})
            finally:
                os.close(fd)
            self.ours.add(kept)
            return kept

        def stream_written(kept: int, *, trim: bool) -> int:
            if kept not in self.ours:
                return inner_written(kept, trim=trim)
            self.ours.discard(kept)
            os.close(kept)  # QEMU closed its end: the splitter sees the end of the stream
            return 0

        setattr(qemu_save, "pass_stream_fd", pass_stream_fd)  # noqa: B010
        setattr(qemu_save, "stream_written", stream_written)  # noqa: B010


async def mapped_fork(rt: HostRuntime, hook: MappedRestores, sink: StreamSink,
                      parent: SandboxHandle, count: int, holder: tuple[int, str], fig: Figures,
                      variant: str, splitter: Path) -> None:
    """`variant`: where the raw file goes (shm, huge) and how it is made: py or c (split
    after the save), pipe (bench/fork_map_split.c reads the stream from a FIFO during it)."""
    where, how = variant.split("-")
    k = f"map{count} {variant}"
    # /dev/shm: 4 KiB pages; the fork buffer's tmpfs: huge=always (2 MiB pages, ADR 0010).
    root = "/dev/shm" if where == "shm" else str(rt.fork_buffer.mountpoint)
    work = Path(tempfile.mkdtemp(prefix="psfm-", dir=root))
    ram_bytes = rt.table.record(parent.id).memory_mb * MIB
    kids: list[SandboxHandle] = []
    stream: Path | None = None
    try:
        t0 = time.perf_counter()
        rt.slots.refill_spares(at_least=count)  # as Saves.fork does, while the parent saves
        piped = None
        if how == "pipe":
            os.mkfifo(work / "fifo", 0o600)
            piped = await asyncio.create_subprocess_exec(
                str(splitter), str(work / "fifo"), "0", str(work / "memory"),
                str(work / "state"), str(ram_bytes), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            sink.fifo = work / "fifo"
        try:
            snap = await rt.saves.snapshot(parent.id, internal=True, transient=True,
                                           resync_clock=False)
        finally:
            sink.fifo = None
        saved = time.perf_counter()
        stream = rt.snapshots.stream(snap.info.id)
        files = (stream, snap.info.state_bytes, work / "memory", work / "state", ram_bytes)
        if piped is not None:
            out, err = await piped.communicate()
            if piped.returncode != 0:
                raise RuntimeError(f"splitter: {err.decode().strip()}")
            pages, zeros, kept_pages, kept_bytes, write_ns = (int(v) for v in out.split())
            split = Split(pages=pages, zero_pages=zeros, kept_pages=kept_pages,
                          stream_out=kept_bytes, write_s=write_ns / 1e9)
        elif how == "py":
            split = await asyncio.to_thread(split_stream, *files)
        else:
            split = await asyncio.to_thread(split_stream_c, splitter, *files)
        converted = time.perf_counter()
        hook.by_stream[stream] = (work / "state", work / "memory")

        created: list[float] = []

        async def child() -> float:
            c0 = time.perf_counter()
            kid = await rt.create(snapshot=snap.info.id)
            created.append(time.perf_counter())
            kids.append(kid)
            await kid.exec(["true"])
            return (time.perf_counter() - c0) * 1000

        got = await asyncio.gather(*(child() for _ in range(count)),
                                   rt.saves.resync_parent_clock(parent.id))
        done = time.perf_counter()
        for ms in got[:count]:
            assert isinstance(ms, float)
            fig.add(f"{k} child restore to 1st exec", ms)
        fig.add(f"{k} pause", snap.pause_ms)
        fig.add(f"{k} save (call to return)", (saved - t0) * 1000)
        fig.add(f"{k} split stream", (converted - saved) * 1000)
        fig.add(f"{k}   of which raw file writes", split.write_s * 1000)
        fig.add(f"{k} until every create returned", (max(created) - t0) * 1000)
        fig.add(f"{k} until every create returned, per child",
                (max(created) - t0) * 1000 / count)
        fig.add(f"{k} to every child's 1st exec", (done - t0) * 1000)
        for kid in kids:
            fig.add(f"{k} child VMM PSS+hugetlb MiB (after 1st exec)", pss_mib(kid.pid))
        fig.sizes["raw file allocated MiB"] = os.stat(work / "memory").st_blocks * 512 / MIB
        if piped is None:
            fig.sizes["stream MiB"] = split.stream_in / MIB
        fig.sizes.update({
                          "kept stream KiB": split.stream_out / 1024,
                          "main block pages into the raw file": split.pages,
                          "main block zero pages (holes)": split.zero_pages,
                          "small blocks' pages kept in the stream": split.kept_pages})
        if split.blocks and not fig.blocks:
            print(f"RAM blocks: {split.blocks}; main: {split.main}")
            fig.blocks = split.blocks
        for kid in kids:
            value = await holder_value(kid, holder[0])
            if value != holder[1]:
                raise RuntimeError(f"mapped child {kid.id} holds {value!r}, not {holder[1]!r}")
    finally:
        if stream is not None:
            hook.by_stream.pop(stream, None)
            rt.delete_snapshot(stream.parent.name)
        for kid in kids:
            await rt.kill(kid.id)
        shutil.rmtree(work, ignore_errors=True)


async def create_floor(rt: HostRuntime, fig: Figures) -> None:
    t0 = time.perf_counter()
    plain = await rt.create()
    await plain.exec(["true"])
    fig.add("create + 1st exec", (time.perf_counter() - t0) * 1000)
    await rt.kill(plain.id)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--dirty-mb", type=int, default=200)
    parser.add_argument("--counts", default="1,3")
    parser.add_argument("--variants", default="shm-py,shm-c,shm-pipe",
                        help="mapped forks to run, WHERE-HOW: WHERE the raw RAM file goes, "
                             "shm (/dev/shm) or huge (the fork buffer's huge=always tmpfs); "
                             "HOW it is split: py or c (bench/fork_map_split.c) after the save, "
                             "pipe (the C splitter reading QEMU's stream during the save)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    variants = args.variants.split(",")
    fig = Figures()
    print(f"load average at start: {os.getloadavg()}")
    async with temp_runtime("psfm-rt-") as (rt, scratch):
        splitter = build_c(scratch)
        await rt.ensure_template()
        parent = await make_dirty(rt, args.dirty_mb)
        holder = await start_holder(parent)
        print(f"parent {parent.id}: {args.dirty_mb} MB dirty, holder pid {holder[0]}")
        # The first fork prepares the fork buffer and huge page pool, as a server's does.
        for kid in await rt.fork(parent.id, count=1):
            await rt.kill(kid.id)
        await settle_fork_machinery(rt)
        hook = MappedRestores(rt)
        sink = StreamSink()
        for r in range(args.n):
            await create_floor(rt, fig)
            for count in counts:
                # Alternate which goes first, so neither always follows the other's cleanup.
                order = ["fork", *variants]
                if r % 2:
                    order.reverse()
                for step in order:
                    if step == "fork":
                        await current_fork(rt, parent, count, holder, fig)
                    else:
                        await mapped_fork(rt, hook, sink, parent, count, holder, fig, step,
                                          splitter)
            print(f"round {r + 1}/{args.n} done, load {os.getloadavg()[0]:.2f}")
        for key, values in fig.values.items():
            print(line(key, values, "MiB" if "MiB" in key else "ms"))
        print(", ".join(f"{key}: {value:.0f}" for key, value in fig.sizes.items()))
        floor = pct(fig.values["create + 1st exec"], 50)
        for count in counts:
            cur = pct(fig.values[f"fork{count} to every child's 1st exec"], 50)
            print(f"count={count}: to every child's 1st exec / create p50: current "
                  f"{cur / floor:.2f}x")
            for variant in variants:
                new = pct(fig.values[f"map{count} {variant} to every child's 1st exec"], 50)
                print(f"  mapped ({variant}): {new / floor:.2f}x")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    asyncio.run(main())
