"""Which host a new sandbox goes to: filter the hosts that can take it, then rank them. Pure
logic over what the control plane knows of each host (`HostView`); the host itself has the
last word (a full one answers `HostExhausted` and the pool tries the next).

Ranking, best first: hosts that already hold the template (no first-use build or fetch),
then the most free memory after this sandbox (as a fraction of the host's), then free vCPUs,
then fewer sandboxes (spread), then the host id (a stable order for equal hosts).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shape:
    """What a sandbox asks of its host."""

    vcpus: int
    memory_mb: int
    template: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HostView:
    """A host as placement sees it. `vcpus`/`memory_mb` are what it offers sandboxes (None:
    not reported, counted as unbounded); `used_*` what its sandboxes hold now."""

    host_id: str
    vcpus: int | None = None
    memory_mb: int | None = None
    used_vcpus: int = 0
    used_memory_mb: int = 0
    sandboxes: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    templates: frozenset[str] = frozenset()
    live: bool = True
    draining: bool = False

    def fits(self, shape: Shape) -> bool:
        if not self.live or self.draining:
            return False
        if any(self.labels.get(k) != v for k, v in shape.labels.items()):
            return False
        if self.vcpus is not None and self.used_vcpus + shape.vcpus > self.vcpus:
            return False
        return self.memory_mb is None or self.used_memory_mb + shape.memory_mb <= self.memory_mb


def _free_fraction(total: int | None, used: int, asked: int) -> float:
    if total is None or total <= 0:
        return 1.0
    return max(0.0, (total - used - asked) / total)


def rank(hosts: Iterable[HostView], shape: Shape, limit: int | None = None) -> list[HostView]:
    """The hosts that fit `shape`, best first (see the module's docstring); with `limit`,
    only the best `limit` of them (a partial sort: with a thousand hosts, the ones a create
    will ever try are the first few)."""
    fitting = [h for h in hosts if h.fits(shape)]

    def key(h: HostView) -> tuple[bool, float, float, int, str]:
        return (shape.template not in h.templates,
                -_free_fraction(h.memory_mb, h.used_memory_mb, shape.memory_mb),
                -_free_fraction(h.vcpus, h.used_vcpus, shape.vcpus),
                h.sandboxes,
                h.host_id)

    if limit is not None and limit < len(fitting):
        return heapq.nsmallest(limit, fitting, key=key)
    return sorted(fitting, key=key)
