"""Metering's configuration (the rate card, the default quota, the allowed size classes) and
the pure arithmetic of a usage report: segments (store/usage.py) clipped to a window, split
at UTC midnight when grouped by day, summed per group and priced. No I/O here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pandastack.wire.usage import RateCard, UsageQuantities, UsageRow

#: The published PandaStack compute rates (US dollars per vCPU-second, per GiB-second of
#: memory). Storage, per GiB-second: about $0.10 per GiB-month for a sandbox's disk and a
#: volume (what block storage costs at the big clouds) and half that for snapshots (object
#: storage); ADR 0025.
VCPU_SECOND_USD = 0.000015
MEMORY_GIB_SECOND_USD = 0.0000045
DISK_GIB_SECOND_USD = 0.00000004
VOLUME_GIB_SECOND_USD = 0.00000004
SNAPSHOT_GIB_SECOND_USD = 0.00000002

#: Every shape the product, its tests and its benchmarks create today, and the usual steps
#: between: a shape outside the list would bake a new template snapshot (disk and minutes).
DEFAULT_SIZE_CLASSES: tuple[tuple[int, int], ...] = (
    (1, 256), (1, 512), (1, 1024), (1, 2048), (2, 256), (2, 512), (2, 1024), (2, 2048),
    (2, 3072), (2, 4096), (4, 4096), (4, 8192), (8, 8192), (8, 16384))


@dataclass(frozen=True)
class Rates:
    vcpu_second: float = VCPU_SECOND_USD
    memory_gib_second: float = MEMORY_GIB_SECOND_USD
    disk_gib_second: float = DISK_GIB_SECOND_USD
    volume_gib_second: float = VOLUME_GIB_SECOND_USD
    snapshot_gib_second: float = SNAPSHOT_GIB_SECOND_USD

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"rate {f.name} must be a finite number >= 0")

    def card(self) -> RateCard:
        return RateCard(**{f.name: getattr(self, f.name) for f in fields(self)})

    def cost(self, q: UsageQuantities) -> float:
        return (q.vcpu_seconds * self.vcpu_second
                + q.memory_gib_seconds * self.memory_gib_second
                + q.disk_gib_seconds * self.disk_gib_second
                + q.volume_gib_seconds * self.volume_gib_second
                + q.snapshot_gib_seconds * self.snapshot_gib_second)


@dataclass(frozen=True)
class QuotaDefaults:
    """The quota of a team that has none of its own (None: unlimited)."""

    max_sandboxes: int | None = None
    max_vcpus: int | None = None
    max_memory_mb: int | None = None
    max_volume_gb: float | None = None
    monthly_budget_usd: float | None = None
    max_hibernated: int | None = None
    max_snapshot_gb: float | None = None
    max_template_gb: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"default quota {f.name} must be >= 0 (or unset: unlimited)")


def parse_size_classes(text: str) -> tuple[tuple[int, int], ...]:
    """"1x512,2x1024" -> ((1, 512), (2, 1024)); ValueError naming the bad entry."""
    shapes: list[tuple[int, int]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        vcpus, sep, memory = item.lower().partition("x")
        try:
            shape = (int(vcpus), int(memory))
        except ValueError:
            shape = (0, 0)
        if not sep or shape[0] < 1 or shape[1] < 1:
            raise ValueError(f"size class {item!r} is not VCPUSxMEMORY_MB (e.g. 2x1024)")
        shapes.append(shape)
    if not shapes:
        raise ValueError("the list of size classes is empty")
    return tuple(dict.fromkeys(shapes))


def format_size_classes(shapes: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"{v}x{m}" for v, m in shapes)


def _number(env: Mapping[str, str], var: str, conv: type[int] | type[float]) -> float | None:
    raw = env.get(var, "").strip()
    if raw == "" or raw.lower() in ("none", "unlimited", "off"):
        return None
    try:
        return conv(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a valid {conv.__name__}") from None


RATE_VARS = {"vcpu_second": "PANDASTACK_RATE_VCPU_SECOND",
             "memory_gib_second": "PANDASTACK_RATE_MEMORY_GIB_SECOND",
             "disk_gib_second": "PANDASTACK_RATE_DISK_GIB_SECOND",
             "volume_gib_second": "PANDASTACK_RATE_VOLUME_GIB_SECOND",
             "snapshot_gib_second": "PANDASTACK_RATE_SNAPSHOT_GIB_SECOND"}
QUOTA_VARS = {"max_sandboxes": ("PANDASTACK_QUOTA_MAX_SANDBOXES", int),
              "max_vcpus": ("PANDASTACK_QUOTA_MAX_VCPUS", int),
              "max_memory_mb": ("PANDASTACK_QUOTA_MAX_MEMORY_MB", int),
              "max_volume_gb": ("PANDASTACK_QUOTA_MAX_VOLUME_GB", float),
              "monthly_budget_usd": ("PANDASTACK_QUOTA_MONTHLY_BUDGET_USD", float),
              "max_hibernated": ("PANDASTACK_QUOTA_MAX_HIBERNATED", int),
              "max_snapshot_gb": ("PANDASTACK_QUOTA_MAX_SNAPSHOT_GB", float),
              "max_template_gb": ("PANDASTACK_QUOTA_MAX_TEMPLATE_GB", float)}


def settings_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """The `Settings` fields of metering that the environment sets (`PANDASTACK_RATE_*`,
    `PANDASTACK_QUOTA_*`, `PANDASTACK_SIZE_CLASSES`)."""
    values: dict[str, object] = {}
    rates = {name: _number(env, var, float) for name, var in RATE_VARS.items()}
    if any(v is not None for v in rates.values()):
        values["rates"] = Rates(**{k: v for k, v in rates.items() if v is not None})
    quota = {name: _number(env, var, conv) for name, (var, conv) in QUOTA_VARS.items()}
    if any(v is not None for v in quota.values()):
        values["quota_defaults"] = QuotaDefaults(**quota)  # type: ignore[arg-type]
    raw = env.get("PANDASTACK_SIZE_CLASSES", "").strip()
    if raw:
        try:
            values["size_classes"] = parse_size_classes(raw)
        except ValueError as exc:
            raise ValueError(f"PANDASTACK_SIZE_CLASSES: {exc}") from None
    return values


# -- the report ---------------------------------------------------------------------------

class Segment(Protocol):
    @property
    def team(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def sandbox_id(self) -> str | None: ...
    @property
    def template(self) -> str | None: ...
    @property
    def vcpus(self) -> int: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def gib(self) -> float: ...
    @property
    def started_at(self) -> float: ...
    @property
    def ended_at(self) -> float | None: ...


def month_start(now: float) -> float:
    """The start of `now`'s month, UTC."""
    day = datetime.fromtimestamp(now, UTC)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def _day_pieces(start: float, end: float) -> Iterable[tuple[str, float]]:
    """(YYYY-MM-DD, seconds) of [start, end) on each UTC day it touches."""
    at = start
    while at < end:
        day = datetime.fromtimestamp(at, UTC).replace(hour=0, minute=0, second=0,
                                                      microsecond=0)
        stop = min(end, (day + timedelta(days=1)).timestamp())
        yield day.date().isoformat(), stop - at
        at = stop


def _add(q: UsageQuantities, seg: Segment, seconds: float) -> None:
    if seg.kind == "compute":
        q.vcpu_seconds += seg.vcpus * seconds
        q.memory_gib_seconds += seg.memory_mb / 1024 * seconds
    elif seg.kind == "disk":
        q.disk_gib_seconds += seg.gib * seconds
    elif seg.kind == "volume":
        q.volume_gib_seconds += seg.gib * seconds
    elif seg.kind == "snapshot":
        q.snapshot_gib_seconds += seg.gib * seconds


def summarize(segments: Iterable[Segment], start: float, end: float, now: float,
              group_by: str, rates: Rates) -> tuple[list[UsageRow], UsageQuantities]:
    """The rows (ordered by team, then key) and totals of what `segments` held within
    [start, end); a segment still open holds until `now`."""
    rows: dict[tuple[str, str, str], UsageRow] = {}
    totals = UsageQuantities()
    for seg in segments:
        lo = max(start, seg.started_at)
        hi = min(end, now if seg.ended_at is None else seg.ended_at)
        if hi <= lo:
            continue
        pieces = list(_day_pieces(lo, hi)) if group_by == "day" else [("", hi - lo)]
        for day, seconds in pieces:
            if group_by == "sandbox":
                by_volume = seg.kind == "volume"
                key = ("v:" if by_volume else "s:") + (seg.subject_id if by_volume
                                                       else seg.sandbox_id or seg.subject_id)
                fields_ = ({"volume_id": seg.subject_id} if by_volume
                           else {"sandbox_id": seg.sandbox_id or seg.subject_id,
                                 "template": seg.template})
            elif group_by == "template":
                key, fields_ = seg.template or "", {"template": seg.template}
            else:
                key, fields_ = day, {"day": day}
            row = rows.get((seg.team, key, ""))
            if row is None:
                row = rows[(seg.team, key, "")] = UsageRow(team=seg.team, **fields_)
            _add(row, seg, seconds)
            _add(totals, seg, seconds)
    ordered = [rows[k] for k in sorted(rows)]
    for row in ordered:
        row.cost_usd = round(rates.cost(row), 9)
    totals.cost_usd = round(rates.cost(totals), 9)
    return ordered, totals
