"""Wire types of usage metering and team quotas (`GET /v1/usage`, `/v1/teams/{team}/quota`),
shared by the server and the SDK. Times are UNIX seconds; money is US dollars."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pandastack.wire.base import Strict

# What a client gets back from this part of the API: `pandastack.sdk.models` re-exports
# these (`import *`), so a new result model is named here, beside its class.
__all__ = [
    "QuotaInfo",
    "QuotaUse",
    "RateCard",
    "UsageQuantities",
    "UsageReport",
    "UsageRow",
]

UsageGroupBy = Literal["sandbox", "day", "template"]
USAGE_GROUPS: tuple[str, ...] = ("sandbox", "day", "template")
#: The limits a team's quota has, in the order they are checked and shown.
QUOTA_LIMITS: tuple[str, ...] = ("max_sandboxes", "max_vcpus", "max_memory_mb", "max_volume_gb",
                                 "monthly_budget_usd", "max_hibernated", "max_snapshot_gb",
                                 "max_template_gb")


class UsageQuantities(Strict):
    vcpu_seconds: float = 0.0
    memory_gib_seconds: float = 0.0
    disk_gib_seconds: float = 0.0
    volume_gib_seconds: float = 0.0
    snapshot_gib_seconds: float = 0.0
    cost_usd: float = 0.0


class UsageRow(UsageQuantities):
    """One group. Its key: `sandbox_id` (group_by=sandbox; a volume's row has `volume_id`
    instead), `template` (group_by=template; None for volumes) or `day` (YYYY-MM-DD, UTC)."""

    team: str
    sandbox_id: str | None = None
    volume_id: str | None = None
    template: str | None = None
    day: str | None = None


class RateCard(Strict):
    """US dollars per unit-second; one card for every size class."""

    vcpu_second: float
    memory_gib_second: float
    disk_gib_second: float
    volume_gib_second: float
    snapshot_gib_second: float


class UsageReport(Strict):
    """What was held in [start, end) (what is still held counts up to the time of the
    answer), grouped, with the totals and the rate card the costs come from."""

    start: float
    end: float
    group_by: UsageGroupBy
    team: str | None = None  # None: every team (an admin's report)
    rows: list[UsageRow]
    totals: UsageQuantities
    rates: RateCard


class QuotaUpdate(Strict):
    """The limits to set; a field left out keeps its value, a null returns it to the
    server's default. 0 forbids (max_sandboxes 0: no new sandbox)."""

    max_sandboxes: int | None = Field(default=None, ge=0, le=1_000_000)
    max_vcpus: int | None = Field(default=None, ge=0, le=100_000_000)
    max_memory_mb: int | None = Field(default=None, ge=0, le=1 << 40)
    max_volume_gb: float | None = Field(default=None, ge=0, le=1e9)
    monthly_budget_usd: float | None = Field(default=None, ge=0, le=1e12)
    max_hibernated: int | None = Field(default=None, ge=0, le=1_000_000)
    max_snapshot_gb: float | None = Field(default=None, ge=0, le=1e9)
    max_template_gb: float | None = Field(default=None, ge=0, le=1e9)


class QuotaUse(Strict):
    """What the team holds now: sandboxes starting, running or paused (hibernated ones do
    not count) and their vCPUs and memory, its volumes, its spend this month (UTC), its
    hibernated sandboxes, the GiB its sandbox and volume snapshots store and the GiB its
    template versions store (disk image and snapshot, as the host measured them at the end
    of each build). What a request under way has admitted (a wake, a hibernate, a resize, a
    build's reservation) counts already."""

    sandboxes: int
    vcpus: int
    memory_mb: int
    volume_gb: float
    month_spend_usd: float
    hibernated: int = 0
    snapshot_gb: float = 0.0
    template_gb: float = 0.0


class QuotaInfo(Strict):
    """A team's limits in force (None: unlimited); `defaults` names those that come from
    the server's configuration rather than the team's own quota."""

    team: str
    max_sandboxes: int | None = None
    max_vcpus: int | None = None
    max_memory_mb: int | None = None
    max_volume_gb: float | None = None
    monthly_budget_usd: float | None = None
    max_hibernated: int | None = None
    max_snapshot_gb: float | None = None
    max_template_gb: float | None = None
    defaults: list[str] = Field(default_factory=list)
    usage: QuotaUse
