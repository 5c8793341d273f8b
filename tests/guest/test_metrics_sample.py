"""The guest's `metrics` sampler, on this machine's own /proc and root file system (the
same kernel interfaces a guest reads); the end-to-end figures of a VM: tests/server/api/
test_api_vm.py."""

from __future__ import annotations

import os
from pathlib import Path

from pandastack.guest import metrics


def test_sample_reads_this_machine() -> None:
    m = metrics.sample(0.05)
    assert m["cpu_count"] == (os.cpu_count() or 1)
    assert 0.0 <= m["cpu_percent"] <= 100.0
    with open("/proc/meminfo", encoding="ascii") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert m["memory_total_bytes"] == total_kb * 1024
    assert 0 < m["memory_used_bytes"] < m["memory_total_bytes"]
    st = os.statvfs("/")
    assert m["disk_total_bytes"] == st.f_blocks * st.f_frsize
    assert 0 < m["disk_used_bytes"] <= m["disk_total_bytes"]
    assert m["window_ms"] == 50


def test_cpu_share_of_a_window(tmp_path: Path) -> None:
    """The non-idle share between two reads of the aggregate line (idle and iowait are
    idle), without sleeping: two fixed /proc/stat snapshots."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    second.write_text("cpu  160 0 140 780 120 0 0 0 0 0\ncpu0 1 2 3 4\n")
    busy0, total0 = metrics._cpu_times(str(first))
    busy1, total1 = metrics._cpu_times(str(second))
    assert (busy1 - busy0, total1 - total0) == (100, 200)  # 50 %
