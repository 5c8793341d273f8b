"""The guest's timer tick before a template is saved: every clone inherits its mode.

Measured (ADR 0038, addendum): under a loaded TCG host the guest's lapic timer interrupts come
late, so jiffies fall behind the TSC; the clocksource watchdog, which checks the TSC against
jiffies (the guest has no other clocksource), then marks the TSC unstable and switches to
`refined-jiffies`. That clocksource cannot drive high-resolution timers, so the tick never
leaves periodic mode: the guest takes HZ (250) timer interrupts a second in idle instead of
~13, in the template and in every clone of it, for good (the TSC is never registered again).

The check reads /proc/timer_list, which states the mode outright (no rate to time): per CPU,
`.nohz_mode` (0: NOHZ inactive) and its tick device's mode (0: periodic, 1: oneshot).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from pandastack.host.agentlink.client import AgentClient
from pandastack.hostport.errors import SetupError

TIMER_LIST = "/proc/timer_list"
CLOCKSOURCE = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
# One exec for both files: a second round trip through TCG is not free.
PROBE = f"cat {CLOCKSOURCE}; echo; cat {TIMER_LIST}"

NOHZ_MODES = {0: "inactive", 1: "lowres", 2: "highres"}
TICK_MODES = {0: "periodic", 1: "oneshot"}
SETTLE_ATTEMPTS = 3
SETTLE_PAUSE_S = 1.0

_CPU = re.compile(r"^cpu: (\d+)$", re.MULTILINE)
_NOHZ = re.compile(r"^\s*\.nohz_mode\s*:\s*(\d+)$", re.MULTILINE)
_TICK_DEVICE = re.compile(r"^Tick Device: mode:\s*(\d+)\n(Broadcast device|Per CPU device: (\d+))$",
                          re.MULTILINE)


class PeriodicTick(SetupError):
    """A baking guest that keeps a periodic tick: only a new boot can help (a re-bake)."""


@dataclass(frozen=True)
class CpuTick:
    cpu: int
    nohz_mode: int
    tick_mode: int

    @property
    def idles_tickless(self) -> bool:
        return self.nohz_mode != 0 and self.tick_mode == 1

    def describe(self) -> str:
        return (f"cpu {self.cpu}: nohz {NOHZ_MODES.get(self.nohz_mode, self.nohz_mode)}, "
                f"tick {TICK_MODES.get(self.tick_mode, self.tick_mode)}")


@dataclass(frozen=True)
class TickState:
    clocksource: str
    cpus: tuple[CpuTick, ...]

    @property
    def ok(self) -> bool:
        return bool(self.cpus) and all(c.idles_tickless for c in self.cpus)

    def describe(self) -> str:
        cpus = "; ".join(c.describe() for c in self.cpus) or f"no CPU found in {TIMER_LIST}"
        return f"clocksource {self.clocksource or '?'}; {cpus}"


def parse_timer_list(text: str) -> dict[int, CpuTick]:
    """Per CPU: its NOHZ mode (from its `cpu: N` section) and its tick device's mode."""
    nohz: dict[int, int] = {}
    starts = list(_CPU.finditer(text))
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        # The tick devices are listed after the last CPU's section: stop there.
        section = text[match.end():end].split("\nTick Device:", 1)[0]
        mode = _NOHZ.search(section)
        if mode is not None:
            nohz[int(match.group(1))] = int(mode.group(1))
    ticks = {int(m.group(3)): int(m.group(1)) for m in _TICK_DEVICE.finditer(text)
             if m.group(3) is not None}
    return {cpu: CpuTick(cpu, nohz[cpu], ticks[cpu]) for cpu in sorted(nohz) if cpu in ticks}


def parse_probe(output: str) -> TickState:
    """`PROBE`'s output: the clocksource's name on the first line, then the timer list."""
    first, _, rest = output.partition("\n")
    return TickState(first.strip(), tuple(parse_timer_list(rest).values()))


async def read(agent: AgentClient) -> TickState:
    result = await agent.exec(PROBE, timeout=60)
    if result.exit_code != 0:
        raise SetupError(f"reading the guest's tick state failed: {result.stderr!r}")
    return parse_probe(result.stdout.decode(errors="replace"))


async def check(agent: AgentClient, *, attempts: int = SETTLE_ATTEMPTS,
                pause_s: float = SETTLE_PAUSE_S) -> TickState:
    """The guest's tick state once it idles tickless; SetupError, naming what was seen and
    the guest kernel's clocksource messages, if it still does not after `attempts` reads.

    The reads are spaced because the switch to oneshot mode happens on the tick after a
    clocksource change; a guest stuck in periodic mode stays so, and only a new boot helps."""
    state = await read(agent)
    for _ in range(attempts - 1):
        if state.ok:
            return state
        await asyncio.sleep(pause_s)
        state = await read(agent)
    if state.ok:
        return state
    log = await agent.exec("dmesg | grep -i -E 'clocksource|tsc' | tail -n 8", timeout=60)
    raise PeriodicTick(
        f"the guest's timer tick is not tickless in idle ({state.describe()}): every clone "
        f"would take a timer interrupt each jiffy; its kernel log says:\n"
        + (log.stdout.decode(errors="replace").strip() or "(nothing about its clocksource)"))
