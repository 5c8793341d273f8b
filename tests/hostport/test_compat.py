"""The rule for API servers and agents of different versions (hostport/compat.py): one host
API level apart works in either order of a rolling upgrade, two apart does not, and the
refusal names the side to upgrade."""

from __future__ import annotations

import pytest

from pandastack.hostport.compat import HOST_PROTOCOL, OURS, Levels, refusal


@pytest.mark.parametrize("agent_level", [HOST_PROTOCOL - 1, HOST_PROTOCOL, HOST_PROTOCOL + 1])
def test_an_agent_within_one_level_works_with_this_server(agent_level: int) -> None:
    assert refusal(OURS, Levels.speaking(agent_level)) is None


def test_agents_that_predate_levels_read_as_level_1_and_work_with_this_server() -> None:
    assert refusal(OURS, Levels(1, 1)) is None  # the registry's defaults for their rows


def test_an_agent_two_levels_behind_is_told_to_upgrade() -> None:
    why = refusal(OURS, Levels.speaking(HOST_PROTOCOL - 2))
    assert why is not None and why.endswith("upgrade the agent")
    assert f"host protocol {HOST_PROTOCOL - 2}" in why


def test_an_agent_two_levels_ahead_asks_for_the_api_servers_upgrade() -> None:
    why = refusal(OURS, Levels.speaking(HOST_PROTOCOL + 2))
    assert why is not None and why.endswith("upgrade the API servers")


def test_an_agent_that_serves_no_older_server_refuses_one_level_behind() -> None:
    """A future change that drops support for older API servers says so by its `oldest`."""
    assert refusal(OURS, Levels(HOST_PROTOCOL + 1, HOST_PROTOCOL + 1)) is not None
    assert refusal(Levels(HOST_PROTOCOL, HOST_PROTOCOL), Levels.speaking(HOST_PROTOCOL - 1))


def test_the_rule_is_the_same_seen_from_either_side() -> None:
    for a in range(HOST_PROTOCOL - 3, HOST_PROTOCOL + 4):
        for b in range(HOST_PROTOCOL - 3, HOST_PROTOCOL + 4):
            one, other = Levels.speaking(a), Levels.speaking(b)
            assert (refusal(one, other) is None) == (refusal(other, one) is None)
            assert (refusal(one, other) is None) == (abs(a - b) <= 1)
