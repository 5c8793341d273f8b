"""Placement's filter and ranking (pure logic)."""

from __future__ import annotations

from pandastack.server.hosts.placement import HostView, Shape, rank

SMALL = Shape(vcpus=1, memory_mb=512, template="base")


def ids(views: list[HostView]) -> list[str]:
    return [v.host_id for v in views]


def test_hosts_that_cannot_take_it_are_left_out() -> None:
    hosts = [HostView("full", vcpus=2, used_vcpus=2), HostView("small", memory_mb=256),
             HostView("down", live=False), HostView("drained", draining=True),
             HostView("gpu", labels={"gpu": "no"}), HostView("ok")]
    assert ids(rank(hosts, SMALL)) == ["gpu", "ok"]
    assert ids(rank(hosts, Shape(1, 512, "base", labels={"gpu": "no"}))) == ["gpu"]


def test_template_present_then_free_memory_then_spread() -> None:
    hosts = [HostView("a", memory_mb=4096, used_memory_mb=3072),
             HostView("b", memory_mb=4096, used_memory_mb=1024),
             HostView("c", memory_mb=4096, used_memory_mb=3072, templates=frozenset({"base"}))]
    assert ids(rank(hosts, SMALL)) == ["c", "b", "a"]
    equal = [HostView("x", sandboxes=3), HostView("y", sandboxes=1), HostView("w", sandboxes=1)]
    assert ids(rank(equal, SMALL)) == ["w", "y", "x"]
