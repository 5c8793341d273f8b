"""Which guest agent the guest tests drive: every test that takes ``agent_cmd`` (the raw-frame
tests do, through ``Raw``) runs against the reference Python agent and against the static
binary (guest-agent/, ADR 0038), so the two are held to the same frames.

The binary's run is skipped only for the operation groups it does not implement yet, listed
here with the reason, so the gap is visible in every report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-guest-agent.sh"
PYTHON_AGENT = [sys.executable, "-m", "pandastack.guest"]

BINARY_GAPS: dict[str, str] = {}
"""Operation group -> why the binary agent's run of its tests is skipped (issue 23)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "agent_ops(group): the agent operation group a guest test exercises"
    )


@pytest.fixture(scope="session")
def binary_agent() -> str:
    """The binary agent, built (or found in its cache) by scripts/build-guest-agent.sh."""
    out = subprocess.run([str(BUILD_SCRIPT)], check=True, capture_output=True, text=True,
                         timeout=600)
    path = out.stdout.strip().splitlines()[-1]
    assert Path(path).is_file(), out.stderr
    return path


@pytest.fixture(params=["python", "binary"])
def agent_cmd(request: pytest.FixtureRequest) -> list[str]:
    """The command that starts an agent (``--fd N`` and options are appended)."""
    if request.param == "python":
        return list(PYTHON_AGENT)
    for mark in request.node.iter_markers("agent_ops"):
        for group in mark.args:
            if group in BINARY_GAPS:
                pytest.skip(f"binary agent: {BINARY_GAPS[group]}")
    return [request.getfixturevalue("binary_agent")]
