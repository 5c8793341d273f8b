"""`metrics`: the guest's own CPU, memory and root-disk use, sampled when asked.

Nothing runs between requests: CPU use is the share of non-idle time across all CPUs over a
short window the request opens (two reads of /proc/stat), so an idle sandbox that nobody
watches costs nothing."""

from __future__ import annotations

import os
import time

from pandastack.guestproto.frames import Frame
from pandastack.guestproto.ops import (
    METRICS_MAX_WINDOW_MS,
    METRICS_MIN_WINDOW_MS,
    METRICS_WINDOW_MS,
)

from .ops import Handler, Op, OpError, arg_int

# /proc/stat's aggregate line: user nice system idle iowait irq softirq steal (guest times are
# already inside user and nice).
IDLE_FIELDS = (3, 4)


def _cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs together."""
    with open(path, encoding="ascii") as f:
        first = f.readline().split()
    if not first or first[0] != "cpu":
        raise OpError("EIO", f"{path} has no aggregate cpu line")
    values = [int(v) for v in first[1:9]]
    idle = sum(values[i] for i in IDLE_FIELDS)
    return sum(values) - idle, sum(values)


def _meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(used, total) bytes: used is what the kernel cannot hand out without reclaiming
    (MemTotal - MemAvailable), the figure that predicts an out-of-memory kill."""
    fields: dict[str, int] = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                fields[name] = int(parts[0]) * 1024
    total = fields.get("MemTotal", 0)
    available = fields.get("MemAvailable", fields.get("MemFree", 0))
    return max(0, total - available), total


def sample(window_s: float, *, sleep: float | None = None) -> dict[str, float | int]:
    busy0, total0 = _cpu_times()
    time.sleep(window_s if sleep is None else sleep)
    busy1, total1 = _cpu_times()
    elapsed = total1 - total0
    cpu_percent = 100.0 * (busy1 - busy0) / elapsed if elapsed > 0 else 0.0
    mem_used, mem_total = _meminfo()
    disk = os.statvfs("/")
    disk_total = disk.f_blocks * disk.f_frsize
    return {
        "cpu_percent": round(min(100.0, max(0.0, cpu_percent)), 2),
        "cpu_count": os.cpu_count() or 1,
        "memory_used_bytes": mem_used,
        "memory_total_bytes": mem_total,
        "disk_used_bytes": disk_total - disk.f_bfree * disk.f_frsize,
        "disk_total_bytes": disk_total,
        "window_ms": int(window_s * 1000),
    }


def metrics(op: Op, f: Frame) -> None:
    window_ms = arg_int(f.header, "window_ms", METRICS_WINDOW_MS, lo=METRICS_MIN_WINDOW_MS)
    op.send("metrics", b"", **sample(min(window_ms, METRICS_MAX_WINDOW_MS) / 1000))


#: The requests this module answers (the agent's dispatch table is made of these).
HANDLERS: dict[str, Handler] = {
    "metrics": lambda a, op, f: metrics(op, f),
}
