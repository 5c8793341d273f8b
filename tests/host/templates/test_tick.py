"""The bake's tick check (templates/tick.py) on /proc/timer_list texts read in real clones: one
of a bake whose clocksource watchdog dropped the TSC (periodic tick, 252 interrupts/s idle), one
of a good bake (oneshot, NOHZ high-res)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pandastack.host.templates import tick
from pandastack.hostport.errors import SetupError
from tests.host.templates.test_tick_texts import (
    BAD_CLOCKSOURCE,
    BAD_TIMER_LIST,
    GOOD_CLOCKSOURCE,
    GOOD_TIMER_LIST,
)


def test_periodic_tick_is_seen() -> None:
    assert tick.parse_timer_list(BAD_TIMER_LIST) == {0: tick.CpuTick(0, nohz_mode=0, tick_mode=0)}
    state = tick.parse_probe(f"{BAD_CLOCKSOURCE}\n\n{BAD_TIMER_LIST}")
    assert not state.ok
    assert state.describe() == "clocksource refined-jiffies; cpu 0: nohz inactive, tick periodic"


def test_tickless_idle_is_seen() -> None:
    assert tick.parse_timer_list(GOOD_TIMER_LIST) == {0: tick.CpuTick(0, nohz_mode=2, tick_mode=1)}
    state = tick.parse_probe(f"{GOOD_CLOCKSOURCE}\n\n{GOOD_TIMER_LIST}")
    assert state.ok
    assert state.describe() == "clocksource tsc; cpu 0: nohz highres, tick oneshot"


def _two_cpus(second: str) -> str:
    """GOOD_TIMER_LIST with a cpu 1 whose sections come from `second` (a guest with 2 vCPUs
    lists each CPU's hrtimer bases, then each CPU's tick device)."""
    head, _, devices = GOOD_TIMER_LIST.partition("\nTick Device:")
    cpu = second[second.index("cpu: 0"):second.index("\nTick Device:")].replace("cpu: 0", "cpu: 1")
    per_cpu = second[second.index("Tick Device: mode:     ", second.index("Broadcast device")):]
    per_cpu = per_cpu.replace("Per CPU device: 0", "Per CPU device: 1")
    return f"{head}\n{cpu}\nTick Device:{devices}\n{per_cpu}"


def test_every_cpu_must_idle_tickless() -> None:
    both = tick.parse_timer_list(_two_cpus(GOOD_TIMER_LIST))
    assert [(c.cpu, c.idles_tickless) for c in both.values()] == [(0, True), (1, True)]
    one_bad = tick.parse_timer_list(_two_cpus(BAD_TIMER_LIST))
    assert [(c.cpu, c.idles_tickless) for c in one_bad.values()] == [(0, True), (1, False)]
    assert not tick.TickState("tsc", tuple(one_bad.values())).ok


def test_no_cpu_found_is_not_ok() -> None:
    state = tick.parse_probe("tsc\n\nTimer List Version: v0.9\n")
    assert not state.ok and "no CPU found" in state.describe()


@dataclass
class _Result:
    exit_code: int
    stdout: bytes
    stderr: bytes = b""


class _Guest:
    """Answers the probe with a sequence of texts (the last one repeats) and the log grep."""

    def __init__(self, *probes: str):
        self.probes = list(probes)
        self.reads = 0

    async def exec(self, cmd: str, timeout: float) -> _Result:
        if cmd == tick.PROBE:
            self.reads += 1
            return _Result(0, self.probes[min(self.reads, len(self.probes)) - 1].encode())
        assert cmd.startswith("dmesg")
        return _Result(0, b"[1.6] clocksource: timekeeping watchdog on CPU0: Marking "
                          b"clocksource 'tsc-early' as unstable because the skew is too large:\n")


BAD = f"{BAD_CLOCKSOURCE}\n{BAD_TIMER_LIST}"
GOOD = f"{GOOD_CLOCKSOURCE}\n{GOOD_TIMER_LIST}"


async def test_check_passes_a_tickless_guest_at_once() -> None:
    guest = _Guest(GOOD)
    assert (await tick.check(guest, pause_s=0)).ok  # type: ignore[arg-type]
    assert guest.reads == 1


async def test_check_waits_out_a_tick_that_is_switching() -> None:
    guest = _Guest(BAD, GOOD)
    assert (await tick.check(guest, attempts=3, pause_s=0)).ok  # type: ignore[arg-type]
    assert guest.reads == 2


async def test_check_fails_a_stuck_tick_naming_what_it_saw() -> None:
    guest = _Guest(BAD)
    with pytest.raises(SetupError) as info:
        await tick.check(guest, attempts=3, pause_s=0)  # type: ignore[arg-type]
    assert guest.reads == 3
    message = str(info.value)
    assert "clocksource refined-jiffies; cpu 0: nohz inactive, tick periodic" in message
    assert "Marking clocksource 'tsc-early' as unstable" in message
