"""The dashboard's charts in a real browser (Debian's Chromium, tests/server/browser.py)
against a real uvicorn over the in-memory host: a sandbox's CPU and memory over time, and the
team's usage per day. Every drawn point is turned back into a value with the scale its <svg>
states (static/charts.js) and compared with what the API served to the page (the responses
the browser received). Screenshots go to the artifacts directory (browser.artifacts_dir)."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Response

from pandastack import Sandbox
from tests.server.browser import Browser
from tests.server.live import FakeServer

SPAN_S = 300  # sandboxes.js CHART_SPAN_S
DAY = 86400
EPS = 0.02  # the chart rounds coordinates to 1/100
TEAM = "default"  # the admin key's, which the browser signs in with


def chart(page: Page, name: str) -> dict[str, Any]:
    """The chart's stated scale, its polyline's points and its bars, read in one go."""
    got: dict[str, Any] = page.evaluate("""(name) => {
        const el = document.querySelector(`svg[data-chart="${name}"]`);
        const num = (k) => Number(el.getAttribute(`data-${k}`));
        const line = el.querySelector("polyline");
        return {x0: num("x0"), x1: num("x1"), y0: num("y0"), y1: num("y1"),
                yMax: num("y-max"), t0: num("t0"), t1: num("t1"),
                points: line ? line.getAttribute("points").trim().split(/\\s+/)
                  .filter(Boolean).map((p) => p.split(",").map(Number)) : [],
                bars: [...el.querySelectorAll("rect.bar")].map((r) => ({
                  day: r.dataset.day, value: Number(r.dataset.value),
                  y: Number(r.getAttribute("y")), height: Number(r.getAttribute("height"))}))};
    }""", name)
    return got


def y_of(value: float, c: dict[str, Any]) -> float:
    return float(c["y1"] - min(value, c["yMax"]) / c["yMax"] * (c["y1"] - c["y0"]))


def check_line(c: dict[str, Any], samples: list[tuple[float, float]]) -> None:
    """`samples` (t, value), oldest first, ending with the newest one drawn."""
    assert c["t1"] == samples[-1][0] and c["t1"] - c["t0"] == pytest.approx(SPAN_S, abs=1e-6)
    shown = [(t, v) for t, v in samples if t >= c["t0"]]
    assert len(c["points"]) == len(shown), (c["points"], shown)
    for (x, y), (t, v) in zip(c["points"], shown, strict=True):
        assert x == pytest.approx(c["x0"] + (t - c["t0"]) / SPAN_S * (c["x1"] - c["x0"]),
                                  abs=EPS)
        assert y == pytest.approx(y_of(v, c), abs=EPS)


def test_cpu_and_memory_over_time(server: FakeServer, signed_in: Browser) -> None:
    page = signed_in.page
    responses: list[Response] = []
    with Sandbox.create(ttl_seconds=600, api_url=server.url,
                        api_key=server.admin_key) as sbx:
        path = re.compile(rf"/dashboard/api/v1/sandboxes/{sbx.id}/metrics$")

        def served(response: Response) -> None:
            if path.search(response.url.split("?")[0]) and response.ok:
                responses.append(response)

        page.on("response", served)
        try:
            page.goto(f"{server.url}/dashboard/#/sandboxes/{sbx.id}")
            points = 'svg[data-chart="{}"] polyline[points*=" "]'  # two points at least
            page.wait_for_selector(points.format("cpu"), state="attached")  # flat: no box
            # Each file moves the fake guest's CPU by 10 % and its memory by the file's size.
            for n in range(2):
                seen = len(responses)
                sbx.files.write(f"/work/ballast-{n}", b"x" * ((8 + 8 * n) << 20))
                page.wait_for_function(
                    "([n]) => document.querySelector('svg[data-chart=\"cpu\"] polyline')"
                    ".getAttribute('points').trim().split(/\\s+/).length >= n",
                    arg=[seen + 2], timeout=30_000)
            cpu, memory = chart(page, "cpu"), chart(page, "memory")
            signed_in.shot("chart-sandbox")
            samples = [r.json() for r in responses]
        finally:
            page.remove_listener("response", served)

    # The charts drew the samples up to the newest one they show (a poll may have landed
    # since the DOM was read).
    (last,) = [i for i, m in enumerate(samples) if m["sampled_at"] == cpu["t1"]]
    drawn = samples[:last + 1]
    check_line(cpu, [(m["sampled_at"], m["cpu_percent"]) for m in drawn])
    assert cpu["yMax"] == 100
    check_line(memory, [(m["sampled_at"], m["memory_used_bytes"]) for m in drawn])
    assert memory["yMax"] == drawn[-1]["memory_total_bytes"]
    # The figures moved (1.5 % and 64 MiB before any file, 21.5 % and +24 MiB after two),
    # and the line went up with them.
    assert {m["cpu_percent"] for m in drawn} >= {1.5, 11.5, 21.5}
    assert drawn[-1]["memory_used_bytes"] - drawn[0]["memory_used_bytes"] == 24 << 20
    assert cpu["points"][-1][1] < cpu["points"][0][1]
    assert memory["points"][-1][1] < memory["points"][0][1]
    assert not signed_in.errors, signed_in.errors


def add_usage(db: Path, team: str, days_ago: int, vcpus: int, hours: float) -> None:
    """A closed compute segment of `hours`, starting at 01:00 UTC `days_ago` days ago, as
    the store writes them (store/usage.py)."""
    today = int(time.time()) // DAY * DAY
    start = today - days_ago * DAY + 3600
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO usage_segments (team, kind, subject_id, sandbox_id, template, "
                     "vcpus, memory_mb, gib, started_at, ended_at) VALUES (?, 'compute', ?, ?, "
                     "'base', ?, 1024, 0.0, ?, ?)",
                     (team, f"sbx-old{days_ago}", f"sbx-old{days_ago}", vcpus, start,
                      start + hours * 3600))


def test_usage_per_day(server: FakeServer, signed_in: Browser, server_dir: Path) -> None:
    for days_ago, vcpus, hours in ((20, 1, 2.0), (9, 4, 3.0), (3, 2, 1.5)):
        add_usage(server_dir / "pandastack.db", TEAM, days_ago, vcpus, hours)
    page = signed_in.page
    with page.expect_response(lambda r: "/v1/usage" in r.url and "group_by=day" in r.url) as got:
        page.goto(f"{server.url}/dashboard/#/usage")
    rows = [r for r in got.value.json()["rows"] if r["day"]]
    page.wait_for_selector('svg[data-chart="vcpu"] rect.bar', state="attached")
    signed_in.shot("chart-usage")
    assert len(rows) >= 3
    measures: dict[str, Callable[[dict[str, Any]], float]] = {
        "cost": lambda r: float(r["cost_usd"]),
        "vcpu": lambda r: float(r["vcpu_seconds"]) / 3600,
        "memory": lambda r: float(r["memory_gib_seconds"]) / 3600}
    for name, value in measures.items():
        c = chart(page, name)
        bars = {b["day"]: b for b in c["bars"]}
        # One bar per UTC day of the 30 the page asked for, today's last.
        assert len(bars) in (30, 31) and max(bars) == time.strftime("%Y-%m-%d", time.gmtime())
        served = {r["day"]: value(r) for r in rows}
        assert c["yMax"] == pytest.approx(max(served.values()))
        for day, bar in bars.items():
            v = served.get(day, 0.0)
            assert bar["value"] == pytest.approx(v), day
            assert bar["y"] == pytest.approx(y_of(v, c), abs=EPS), day
            assert bar["y"] + bar["height"] == pytest.approx(c["y1"], abs=EPS), day
    # The seeded days: 4 vCPUs for 3 h is the tallest vCPU bar, 12 vCPU-hours.
    vcpu = {b["day"]: b["value"] for b in chart(page, "vcpu")["bars"]}
    nine_days_ago = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 9 * DAY))
    assert vcpu[nine_days_ago] == pytest.approx(12.0)
    assert not signed_in.errors, signed_in.errors
