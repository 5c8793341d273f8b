"""The guest console log on the host is capped: a guest writing to its serial port flat out
does not fill the host's disk, and the log's tail stays readable."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from pandastack.host.runtime.console import (
    CONSOLE_CAP_BYTES,
    CONSOLE_CHECK_S,
    CONSOLE_KEEP_BYTES,
    trim_console,
)
from pandastack.host.runtime.sandbox import SandboxHandle, _console_last_words

# What a guest may add between two checks, with room to spare: a TCG guest wrote 0.58 MB/s at
# most (host/runtime/console.py), so one CONSOLE_CHECK_S is ~0.6 MB; this allows about three
# times that.
OVERSHOOT_BYTES = 2 << 20
# The flood is a byte count, not a duration: 256 KiB past what the log may ever hold, so the
# cap must have struck (several trims at TCG's rate) by the time it ends, in ~8 s instead of
# a fixed 20. FLOOD_S only bounds it on a slow machine.
FLOOD_BYTES = CONSOLE_CAP_BYTES + OVERSHOOT_BYTES + (256 << 10)
FLOOD_S = 120


def test_trim_keeps_the_tail_and_an_appending_writer_writes_at_the_new_end(
        tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    writer = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # as QEMU's append=on
    try:
        os.write(writer, b"a" * 100 + b"last words\n")
        assert not trim_console(log, cap=200, keep=20)  # under the cap: left alone
        os.write(writer, b"b" * 300 + b"Kernel panic - not syncing\n")
        assert trim_console(log, cap=200, keep=27)
        assert log.read_bytes() == b"Kernel panic - not syncing\n"
        assert _console_last_words(log) == "Kernel panic - not syncing"
        os.write(writer, b"after\n")
        assert log.read_bytes() == b"Kernel panic - not syncing\nafter\n"  # no hole
        assert log.stat().st_blocks * 512 < 64 << 10
    finally:
        os.close(writer)
    assert not trim_console(tmp_path / "gone.log")


@pytest.mark.vm
async def test_a_guest_flooding_its_console_stays_under_the_cap(
        sandbox: SandboxHandle) -> None:
    log = sandbox.workdir / "console.log"
    # wc counts what went to the console: more than the bound, or the test could not fail.
    flood = asyncio.create_task(sandbox.exec(
        f"timeout {FLOOD_S} head -c {FLOOD_BYTES} /dev/zero | tee /dev/ttyS0 | wc -c",
        timeout=FLOOD_S + 60))
    largest = 0
    started = time.monotonic()
    while not flood.done() and time.monotonic() - started < FLOOD_S + 60:
        largest = max(largest, log.stat().st_size, log.stat().st_blocks * 512)
        await asyncio.sleep(0.2)
    result = await flood
    assert result.exit_code == 0 and result.stdout.strip().isdigit(), result
    assert int(result.stdout) > CONSOLE_CAP_BYTES + OVERSHOOT_BYTES, result
    assert largest <= CONSOLE_CAP_BYTES + OVERSHOOT_BYTES, largest
    await asyncio.sleep(CONSOLE_CHECK_S * 2)
    assert log.stat().st_size <= CONSOLE_CAP_BYTES + OVERSHOOT_BYTES
    # The sandbox still works, and what the guest writes now is still logged.
    marker = f"console-marker-{os.getpid()}"
    done = await sandbox.exec(f"echo {marker} > /dev/ttyS0; echo ok")
    assert done.stdout == b"ok\n"
    # The guest's write returns once its tty holds the line; the UART sends it after.
    deadline = time.monotonic() + 30
    while marker.encode() not in log.read_bytes()[-CONSOLE_KEEP_BYTES:]:
        assert time.monotonic() < deadline, "the marker never reached the console log"
        await asyncio.sleep(0.1)
