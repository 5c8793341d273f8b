"""`metrics` through raw frames, the same request to both agents on this machine: the same
fields, the same machine totals, the window clamped and a bad one refused alike."""

from __future__ import annotations

from typing import Any

import pytest

from tests.guest.conftest import PYTHON_AGENT
from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)


def ask(cmd: list[str], **fields: Any) -> dict[str, Any]:
    r = Raw(cmd=cmd)
    try:
        r.hello()
        r.req("metrics", 1, **fields)
        return r.recv_until(1, "metrics")[-1].header
    finally:
        r.close()


def test_metrics_match_the_reference(agent_cmd: list[str]) -> None:
    ref = ask(PYTHON_AGENT)
    got = ask(agent_cmd, window_ms=50)
    assert got["t"] == "metrics" and set(got) == set(ref)
    for key in ("cpu_count", "memory_total_bytes", "disk_total_bytes"):
        assert got[key] == ref[key], key
    assert 0 <= got["cpu_percent"] <= 100 and got["window_ms"] == 50
    assert 0 < got["memory_used_bytes"] <= got["memory_total_bytes"]
    assert 0 < got["disk_used_bytes"] <= got["disk_total_bytes"]


@pytest.mark.parametrize(("window", "answer"), [(5000, 2000), (10, 10)])
def test_the_window_is_clamped(agent_cmd: list[str], window: int, answer: int) -> None:
    assert ask(agent_cmd, window_ms=window)["window_ms"] == answer


@pytest.mark.parametrize("window", [9, -1, "200", True, 1.5])
def test_a_bad_window_is_einval(agent_cmd: list[str], window: object) -> None:
    got = ask(agent_cmd, window_ms=window)
    assert (got["t"], got["code"]) == ("error", "EINVAL")


