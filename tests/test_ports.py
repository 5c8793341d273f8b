"""tests/ports.py: ports for child servers come from below the ephemeral range, from the
worker's own slice, never twice."""

from __future__ import annotations

import socket

import pytest

from tests import ports


def test_ports_are_bindable_distinct_and_in_the_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    picked = [ports.free_port() for _ in range(20)]
    assert len(set(picked)) == 20
    size = (ports.PORT_RANGE[1] - ports.PORT_RANGE[0]) // ports.SLICES
    assert all(ports.PORT_RANGE[0] + size <= p < ports.PORT_RANGE[0] + 2 * size for p in picked)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", picked[-1]))


def test_a_held_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    size = (ports.PORT_RANGE[1] - ports.PORT_RANGE[0]) // ports.SLICES
    start = ports.PORT_RANGE[0] + 2 * size
    held = []
    try:
        # Hold every port of the slice but one: that one is the answer.
        for port in range(start, start + size):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        last = held.pop()
        free = last.getsockname()[1]
        last.close()
        ports._handed.discard(free)
        assert ports.free_port() == free
    finally:
        for sock in held:
            sock.close()
