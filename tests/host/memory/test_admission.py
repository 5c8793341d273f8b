"""Admission by the host's real memory (host/memory/admission.py), its accounting alone: a
readings source stands in for /proc/meminfo (the real-VM refusal is
tests/e2e/test_memory_admission.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.memory.admission import (
    TCG_START_MB,
    VMM_FIXED_MB,
    MemoryAdmission,
    default_reserve_mb,
    read_meminfo,
    vm_start_mb,
)
from pandastack.hostport.errors import HostExhausted, HostMemoryExhausted


class Readings:
    """MemTotal and MemAvailable as the test sets them; counts the reads."""

    def __init__(self, total: int = 24_000, available: int = 2_000) -> None:
        self.total, self.available, self.reads = total, available, 0

    def __call__(self) -> tuple[int, int]:
        self.reads += 1
        return self.total, self.available


def test_reserve_default_is_five_percent_at_least_a_gib() -> None:
    assert default_reserve_mb(24_105) == 1205  # this machine
    assert default_reserve_mb(8_192) == 1024
    assert default_reserve_mb(512_000) == 25_600
    assert MemoryAdmission(meminfo=Readings(total=24_105)).status().reserve_mb == 1205  # type: ignore[union-attr]
    assert MemoryAdmission(0, meminfo=Readings()).status().reserve_mb == 0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="0 or more"):
        MemoryAdmission(-1)


def test_reserve_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PANDASTACK_MEMORY_RESERVE_MB", raising=False)
    assert HostConfig.from_env().memory_reserve_mb is None
    monkeypatch.setenv("PANDASTACK_MEMORY_RESERVE_MB", "auto")
    assert HostConfig.from_env().memory_reserve_mb is None
    monkeypatch.setenv("PANDASTACK_MEMORY_RESERVE_MB", "3072")
    assert HostConfig.from_env().memory_reserve_mb == 3072
    monkeypatch.setenv("PANDASTACK_MEMORY_RESERVE_MB", "-5")
    with pytest.raises(ValueError, match="memory_reserve_mb"):
        HostConfig.from_env()


def test_vm_start_estimate() -> None:
    clone = vm_start_mb(tcg=True, tb_size_mb=64)
    assert clone == VMM_FIXED_MB + TCG_START_MB == 40  # bench/density.py's host MiB per VM
    assert vm_start_mb(tcg=True, tb_size_mb=8) == VMM_FIXED_MB + 8  # never over tb-size
    assert vm_start_mb(tcg=False, tb_size_mb=64) == VMM_FIXED_MB  # KVM translates nothing
    # A stream's bytes, rounded up to whole MiB.
    assert vm_start_mb(tcg=True, tb_size_mb=64, loaded_bytes=(100 << 20) + 1) == clone + 101


def test_refused_under_the_reserve_with_a_clear_message() -> None:
    admission = MemoryAdmission(1000, meminfo=Readings(available=1100))
    first = admission.reserve(60, "create sbx-a")
    with pytest.raises(HostMemoryExhausted) as refused:
        admission.reserve(60, "create sbx-b")  # 1100 - 60 - 60 < 1000
    assert isinstance(refused.value, HostExhausted)  # the pool tries the next host
    message = str(refused.value)
    assert "create sbx-b" in message and "1100 MiB available (MemAvailable)" in message
    assert "60 MiB of it reserved by 1 VM starts under way" in message
    assert "1000 MiB stay in reserve (PANDASTACK_MEMORY_RESERVE_MB)" in message
    assert (refused.value.available_mb, refused.value.reserve_mb,
            refused.value.need_mb) == (1100, 1000, 60)
    first.release()
    admission.reserve(60, "create sbx-b").release()  # the room came back
    assert admission.held_mb == 0


def test_release_on_success_and_on_failure_is_once() -> None:
    readings = Readings(available=1200)
    admission = MemoryAdmission(1000, meminfo=readings)
    with admission.reserve(150, "create sbx-ok") as held:
        assert admission.held_mb == 150
    assert admission.held_mb == 0
    with pytest.raises(RuntimeError), admission.reserve(150, "create sbx-fails"):
        assert admission.held_mb == 150
        raise RuntimeError("the restore failed")
    assert admission.held_mb == 0
    held.release()  # released twice: the second gives nothing back
    other = admission.reserve(100, "create sbx-c")
    held.release()
    assert admission.held_mb == 100
    other.release()
    status = admission.status()
    assert status is not None and (status.held_mb, status.starting) == (0, 0)
    assert status.room_mb == 200


def test_concurrent_starts_cannot_all_pass_on_one_reading() -> None:
    """MemAvailable does not move while VMs start (their memory is not in it yet): only the
    reservations stop the eleventh of 16 threads, and the 11th of 16 tasks."""
    readings = Readings(available=1000 + 10 * 40)
    admission = MemoryAdmission(1000, meminfo=readings)
    passed: list[object] = []
    refused: list[HostMemoryExhausted] = []
    start = threading.Barrier(16)

    def create(i: int) -> None:
        start.wait()
        try:
            passed.append(admission.reserve(40, f"create sbx-{i}"))
        except HostMemoryExhausted as exc:
            refused.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert (len(passed), len(refused), admission.held_mb) == (10, 6, 400)
    for r in passed:
        r.release()  # type: ignore[attr-defined]
    assert admission.held_mb == 0

    async def creates() -> list[object]:
        async def one(i: int) -> object:
            await asyncio.sleep(0)
            return admission.reserve(40, f"create sbx-{i}")

        return await asyncio.gather(*(one(i) for i in range(16)), return_exceptions=True)

    results = asyncio.run(creates())
    assert sum(isinstance(r, HostMemoryExhausted) for r in results) == 6
    assert readings.reads == 32  # one small read per start, whatever is running


def test_no_reading_no_verdict(tmp_path: Path) -> None:
    admission = MemoryAdmission(1000, meminfo=lambda: None)
    admission.reserve(10**6, "create sbx-x").release()
    assert admission.status() is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemFree:  100 kB\n"
                       "MemAvailable:   20971520 kB\nBuffers: 1 kB\n")
    assert read_meminfo(meminfo) == (24105, 20480)
    meminfo.write_text("MemTotal:       24683520 kB\n")
    assert read_meminfo(meminfo) is None
    assert read_meminfo(tmp_path / "missing") is None
    assert read_meminfo() is not None  # this machine's


def test_a_first_command_stays_held_from_up_until_it_ran_or_the_vm_ended() -> None:
    admission = MemoryAdmission(1000, meminfo=Readings(available=1000 + 100))
    a = admission.reserve(40, "create sbx-a", later_mb=16)
    assert admission.held_mb == 40
    a.up("/s/sbx-a")  # what its start took is in MemAvailable now; its first exec is not
    assert admission.held_mb == 16
    b = admission.reserve(40, "create sbx-b", later_mb=16)
    with pytest.raises(HostMemoryExhausted, match="the first commands of 1 new VMs"):
        admission.reserve(50, "create sbx-c")  # 1100 - 16 - 40 - 50 < 1000
    b.up("/s/sbx-b")
    admission.first_command("/s/sbx-a")
    admission.first_command("/s/sbx-a")  # once only
    assert admission.held_mb == 16
    admission.ended("/s/sbx-b")
    assert admission.held_mb == 0
    # A start that fails after `up` gives back all; as a context manager too.
    c = admission.reserve(40, "create sbx-c", later_mb=16)
    c.up("/s/sbx-c")
    c.release()
    assert admission.held_mb == 0
    with admission.reserve(40, "wake sbx-d", later_mb=16) as d:
        d.up("/s/sbx-d")
    assert admission.held_mb == 16  # up, and no error: only its first command stays
    with pytest.raises(RuntimeError), admission.reserve(40, "wake sbx-e", later_mb=16) as e:
        e.up("/s/sbx-e")
        raise RuntimeError("its agent did not answer after all")
    assert admission.held_mb == 16
    admission.ended("/s/sbx-d")
    assert admission.held_mb == 0
    # The TCG part is what comes later; KVM translates nothing.
    assert admission.vm_start("create sbx-f", "tcg").later_mb == TCG_START_MB
    assert admission.vm_start("create sbx-g", "kvm").later_mb == 0
