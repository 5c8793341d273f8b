"""Split a QEMU 7.2 migration stream (a fork's save) into a raw RAM file and a stream without
the main RAM block's pages (bench/fork_map.py, issue 36).

The format, from QEMU 7.2's migration/savevm.c and migration/ram.c: the header (magic
`QEVM`, version 3), the configuration section, then the RAM section (`START`, idstr "ram",
version 4) whose payload is 64-bit big-endian words `address | flags` with their data, ended
by `EOS`; `PART` sections of pages, its `END` section; each section followed by a footer
(0x7e, section id). Then device sections (`FULL`), `EOF` and the JSON description, which are
copied as they are. Only the flags a stopped save with `x-ignore-shared` writes are
understood (no compression, XBZRLE, RDMA hooks or postcopy): anything else is an error, not
a guess.

The kept stream holds every section: the RAM block list (`MEM_SIZE`, so the destination
checks the blocks as always), the pages of the small blocks (firmware, ACPI tables) and the
`EOS` markers. The main block's pages go into the raw file at their offsets; zero pages are
left as holes. QEMU's loader leaves a page the stream does not send as its backend has it,
so a destination that maps the raw file privately sees the source's memory.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

QEVM = 0x5145564D
SECTION_START, SECTION_PART, SECTION_END = 0x01, 0x02, 0x03
SECTION_FOOTER = 0x7E
FLAG_ZERO, FLAG_MEM_SIZE, FLAG_PAGE, FLAG_EOS, FLAG_CONTINUE = 0x02, 0x04, 0x08, 0x10, 0x20
PAGE = 4096
FLAG_MASK = PAGE - 1
# savevm.c's section header of the RAM handler: START, section id, "ram", instance 0, v4.
RAM_START = re.compile(rb"\x01(....)\x03ram\x00\x00\x00\x00\x00\x00\x00\x04", re.DOTALL)
IOV_MAX = 1024
BE32 = struct.Struct(">I")
BE64 = struct.Struct(">Q")
Write = Callable[[bytes | memoryview], object]


class StreamFormatError(ValueError):
    pass


@dataclass
class Split:
    blocks: dict[str, int] = field(default_factory=dict)  # idstr -> used length
    main: str = ""
    pages: int = 0  # main block pages written into the raw file
    zero_pages: int = 0  # main block zero pages (holes)
    kept_pages: int = 0  # pages of other blocks, kept in the stream
    stream_in: int = 0
    stream_out: int = 0
    write_s: float = 0.0  # of the split's time, in writes to the raw file


class _RawWriter:
    """Contiguous pages go to the raw file in one `pwritev`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.write_s = 0.0
        self.start = -1
        self.end = -1
        self.parts: list[memoryview] = []

    def add(self, addr: int, data: memoryview) -> None:
        if addr != self.end or len(self.parts) >= IOV_MAX:
            self.flush()
            self.start = addr
        self.parts.append(data)
        self.end = addr + len(data)

    def flush(self) -> None:
        if self.parts:
            want = self.end - self.start
            t0 = time.perf_counter()
            if os.pwritev(self.fd, self.parts, self.start) != want:
                raise OSError("short write to the raw RAM file")
            self.write_s += time.perf_counter() - t0
            self.parts = []
        self.start = self.end = -1


def split_stream(stream: Path, length: int, raw: Path, kept: Path, ram_bytes: int) -> Split:
    """Write `raw` (sparse, `ram_bytes` long) and `kept` from the first `length` bytes of
    `stream` (a fork buffer holds an older, longer stream's tail beyond them)."""
    out = Split(stream_in=length)
    with open(stream, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    raw_fd = os.open(raw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(raw_fd, ram_bytes)
        raw_writer = _RawWriter(raw_fd)
        with open(kept, "wb") as dst:
            _split(view, length, raw_writer, dst.write, ram_bytes, out)
            out.stream_out = dst.tell()
        out.write_s = raw_writer.write_s
    finally:
        os.close(raw_fd)
        view.release()
        mm.close()
    return out


def _split(mm: memoryview, length: int, raw: _RawWriter, write: Write, ram_bytes: int,
           out: Split) -> None:
    if BE32.unpack_from(mm, 0)[0] != QEVM or BE32.unpack_from(mm, 4)[0] != 3:
        raise StreamFormatError("not a QEMU migration stream, version 3")
    found = RAM_START.search(mm[:1 << 16].tobytes())
    if found is None:
        raise StreamFormatError("no RAM section start near the stream's head")
    write(mm[:found.start()])  # header and configuration, as they are
    (ram_id,) = BE32.unpack(found.group(1))
    pos = found.start()
    last_block = ""  # the block a CONTINUE record refers to, in the source stream
    while True:
        kind = mm[pos]
        if kind not in (SECTION_START, SECTION_PART, SECTION_END):
            raise StreamFormatError(f"section type {kind:#x} before the RAM section ended")
        (sid,) = BE32.unpack_from(mm, pos + 1)
        if sid != ram_id:
            raise StreamFormatError(f"iterable section {sid} is not RAM's ({ram_id})")
        head_end = found.end() if kind == SECTION_START else pos + 5
        write(mm[pos:head_end])
        pos, last_block = _ram_payload(mm, head_end, raw, write, ram_bytes, out, last_block)
        if mm[pos] != SECTION_FOOTER or BE32.unpack_from(mm, pos + 1)[0] != sid:
            raise StreamFormatError(f"no footer after RAM section at {pos}")
        write(mm[pos:pos + 5])
        pos += 5
        if kind == SECTION_END:
            break
    raw.flush()
    write(mm[pos:length])  # device state, EOF, the JSON description


def _ram_payload(mm: memoryview, pos: int, raw: _RawWriter, emit: Write, ram_bytes: int,
                 out: Split, last_block: str) -> tuple[int, str]:
    """One RAM section's payload up to and including its EOS; returns the position after."""
    unpack64 = BE64.unpack_from
    while True:
        (word,) = unpack64(mm, pos)
        flags = word & FLAG_MASK
        addr = word & ~FLAG_MASK
        start = pos
        pos += 8
        if flags & FLAG_MEM_SIZE:
            total = addr
            while total > 0:
                n = mm[pos]
                name = mm[pos + 1:pos + 1 + n].tobytes().decode()
                (used,) = unpack64(mm, pos + 1 + n)
                # + the block's guest address: written with x-ignore-shared, as our saves set.
                pos += 1 + n + 8 + 8
                out.blocks[name] = used
                total -= used
            if total != 0:
                raise StreamFormatError("RAM block list does not add up")
            mains = [b for b, size in out.blocks.items() if size == ram_bytes]
            if len(mains) != 1:
                raise StreamFormatError(f"no single block of the guest's RAM: {out.blocks}")
            out.main = mains[0]
            emit(mm[start:pos])
            continue
        if flags & FLAG_EOS:
            emit(mm[start:pos])
            return pos, last_block
        if not flags & (FLAG_ZERO | FLAG_PAGE) or flags & ~(
                FLAG_ZERO | FLAG_PAGE | FLAG_CONTINUE):
            raise StreamFormatError(f"RAM record flags {flags:#x} not understood at {start}")
        if not flags & FLAG_CONTINUE:
            n = mm[pos]
            last_block = mm[pos + 1:pos + 1 + n].tobytes().decode()
            pos += 1 + n
        data_at = pos
        pos += 1 if flags & FLAG_ZERO else PAGE
        if last_block == out.main:
            if flags & FLAG_PAGE:
                raw.add(addr, mm[data_at:pos])
                out.pages += 1
            elif mm[data_at] != 0:  # a page of one repeated byte: QEMU sends none today
                raw.add(addr, memoryview(bytes([mm[data_at]]) * PAGE))
                out.pages += 1
            else:
                out.zero_pages += 1
            continue
        # A small block's page: kept, always with its block's name (the records dropped
        # between make CONTINUE refer to another block than in the source).
        idstr = last_block.encode()
        emit(BE64.pack(addr | (flags & ~FLAG_CONTINUE)) + bytes([len(idstr)]) + idstr)
        emit(mm[data_at:pos])
        out.kept_pages += 1


def split_stream_c(binary: Path, stream: Path, length: int, raw: Path, kept: Path,
                   ram_bytes: int) -> Split:
    """The same split by bench/fork_map_split.c (`binary`, built by `build_c`)."""
    done = subprocess.run([str(binary), str(stream), str(length), str(raw), str(kept),
                           str(ram_bytes)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StreamFormatError(done.stderr.strip() or f"exit {done.returncode}")
    pages, zeros, kept_pages, kept_bytes, write_ns = (int(v) for v in done.stdout.split())
    return Split(pages=pages, zero_pages=zeros, kept_pages=kept_pages, stream_in=length,
                 stream_out=kept_bytes, write_s=write_ns / 1e9)


def build_c(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "fork_map_split"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary),
                    str(Path(__file__).with_name("fork_map_split.c"))], check=True)
    return binary
