"""docs/grafana-dashboard.json references only metric names that the API server's and the
agent's /metrics export: both are scraped from apps running here (the fake runtime), after
a create, an error response and a host API call so that every labelled series has a sample."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from pandastack.host.api import create_host_app
from pandastack.metrics_access import MetricsAccess
from tests.server.conftest import make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.web.test_metrics_fake import new_sandbox, samples

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana-dashboard.json"
# What PromQL may name in an expression besides metrics (labels are cut out before looking).
PROMQL_WORDS = frozenset({
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "topk", "bottomk", "clamp_min", "clamp_max", "abs", "delta", "deriv", "time",
})
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield str(target["expr"])
            yield from walk(panel.get("panels", []))  # rows hold panels
    yield from walk(dashboard["panels"])


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: label matchers {..}, ranges [..], grouping
    label lists (by/without/on/ignoring (..)) and legend-like strings cut away first."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    names = set(IDENTIFIER.findall(re.sub(r"\b\d+(\.\d+)?(e\d+)?\b", " ", expr)))
    return names - PROMQL_WORDS


async def exported_names(tmp_path: Path) -> set[str]:
    names: set[str] = set()
    async with running_app(make_settings(tmp_path), FakeRuntime(tmp_path)) as api:
        await new_sandbox(api)
        # An error response: the errors counter has a series only once one was counted.
        assert (await api.client.get("/v1/sandboxes/sbx-000000000000")).status_code == 404
        r = await api.client.get("/metrics")
        assert r.status_code == 200, r.text
        names |= {name for name, _ in samples(r.text)}
    runtime = FakeRuntime(tmp_path / "agent")
    agent = create_host_app(runtime, "agent-token", metrics_access=MetricsAccess(loopback=True))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(agent),
                                 base_url="http://agent") as client:
        sandbox = await runtime.create(vcpus=1, memory_mb=256)
        r = await client.get(f"/v1/sandboxes/{sandbox.id}/metrics", params={"window_ms": 20},
                             headers={"Authorization": "Bearer agent-token"})
        assert r.status_code == 200, r.text
        r = await client.get("/metrics")
        assert r.status_code == 200, r.text
        names |= {name for name, _ in samples(r.text)}
    return names


def test_metric_names_are_read_from_expressions() -> None:
    got = metric_names('histogram_quantile(0.95, sum by (le, operation) '
                       '(rate(pandastack_x_bucket{host="a b"}[$__rate_interval]))) '
                       '+ on (host) pandastack_y * 1048576')
    assert got == {"pandastack_x_bucket", "pandastack_y"}
    assert metric_names("sum(rate(pandastack_typo_totl[5m]))") == {"pandastack_typo_totl"}


async def test_dashboard_references_only_exported_metrics(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = await exported_names(tmp_path)
    referenced: set[str] = set()
    for expr in expressions(dashboard):
        names = metric_names(expr)
        assert names, f"an expression that reads no metric: {expr!r}"
        referenced |= names
    assert referenced <= exported, sorted(referenced - exported)
    # Every family either process exports has a panel (a new metric gets one).
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in exported
                if n.startswith("pandastack_")}
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in referenced}
    assert families <= shown, sorted(families - shown)

    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {t["refId"] for t in panel["targets"]} and panel["gridPos"]["w"] <= 24
