"""A cap on the guest console logs: a guest can write to its serial port flat out
(`cat /dev/zero > /dev/ttyS0`), and its VMM appends everything to `console.log` on the host.

The runtime trims every console log of its state dir that grew past CONSOLE_CAP_BYTES, once
every CONSOLE_CHECK_S, down to its last CONSOLE_KEEP_BYTES. The log stays a plain file, so its
tail is still there after the VMM exits (the last words of a guest that panicked, the logs
route). A ring buffer inside the VMM would bound it, but its contents die with the process.

Between two checks a guest can add what it writes in CONSOLE_CHECK_S: a TCG guest wrote
0.45 MB/s on average (0.58 MB/s at most over 0.5 s, n=1, 15 s of `cat /dev/zero`), so the file
stays under about CONSOLE_CAP_BYTES + 0.6 MB there. While no runtime runs (a restart of the
host process), nothing trims: VMs keep running and their logs grow at that rate.

Every driver's VMM opens the file with O_APPEND (`VMPaths.console_log`): after a trim, its
writes land at the new end, not at its old offset (which would leave a hole as long as what
was cut).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

CONSOLE_CAP_BYTES = 1 << 20
CONSOLE_KEEP_BYTES = 64 << 10
CONSOLE_CHECK_S = 1.0
CONSOLE_LOG = "console.log"


def trim_console(path: Path, cap: int = CONSOLE_CAP_BYTES,
                 keep: int = CONSOLE_KEEP_BYTES) -> bool:
    """Cut `path` down to its last `keep` bytes if it is longer than `cap`; True if cut.

    The tail is read, the file emptied and the tail appended again: what the guest writes in
    between (microseconds) lands before the tail or, between the read and the truncate, is lost.
    Both only happen to a guest that writes flat out."""
    try:
        if os.stat(path, follow_symlinks=False).st_size <= cap:
            return False  # the common case: one stat per sandbox and check
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False  # gone with its sandbox, or not a plain file of ours
    try:
        size = os.fstat(fd).st_size
        if size <= cap:
            return False
        tail = os.pread(fd, keep, max(0, size - keep))
        os.ftruncate(fd, 0)
        os.write(fd, tail)
        return True
    finally:
        os.close(fd)


def trim_consoles(directory: Path) -> list[Path]:
    """Trim the console log of every VM directory in `directory`; the ones that were cut."""
    trimmed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    for entry in entries:
        log = entry / CONSOLE_LOG
        if trim_console(log):
            trimmed.append(log)
    return trimmed


async def watch_consoles(directory: Path, report: Callable[[str], None],
                         interval_s: float = CONSOLE_CHECK_S) -> None:
    """Trim the console logs under `directory` every `interval_s`, until cancelled. Each log
    is reported once (a guest that floods its console would else be reported every pass)."""
    reported: set[Path] = set()
    while True:
        try:
            for log in await asyncio.to_thread(trim_consoles, directory):
                if log not in reported:
                    reported.add(log)
                    report(f"console log {log} grew past {CONSOLE_CAP_BYTES} bytes: "
                           f"trimmed to its last {CONSOLE_KEEP_BYTES}")
            reported = {log for log in reported if log.parent.exists()}
        except Exception as exc:  # a failed pass is no reason to stop the next one
            report(f"console log check failed: {exc}")
        await asyncio.sleep(interval_s)
