"""Admission by the host's real memory (ADR 0050) on a live `pandastack serve`: with
PANDASTACK_MEMORY_RESERVE_MB above this machine's MemAvailable, a create through the SDK and
E2B's REST create are refused with 503 and a message naming the host's available memory and
the reserve, and nothing is left (no VM, no sandbox directory: run_live_server's checks; no
sandbox in the list). No VM boots: the refusal comes before anything is made. (E2B's SDK
retries a 503 three times, 5 s apart, then raises ServiceBusyException with that message:
seen by hand, not tested here, for its 15 s.)"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from pandastack import Client
from pandastack.host.memory.admission import read_meminfo
from pandastack.sdk.errors import ServerError
from pandastack.server.compat.e2b.rest.base import e2b_key
from tests.e2e.conftest import LiveServer, run_live_server

pytestmark = [pytest.mark.vm, pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def starved() -> Iterator[tuple[LiveServer, int]]:
    reading = read_meminfo()
    assert reading is not None
    reserve = reading[0] * 2  # twice MemTotal: above any MemAvailable
    with run_live_server({"PANDASTACK_MEMORY_RESERVE_MB": str(reserve)}) as server:
        yield server, reserve


def test_a_create_is_refused_with_503_naming_the_memory(starved: tuple[LiveServer, int]
                                                        ) -> None:
    server, reserve = starved
    with Client(server.api_url, server.api_key) as client:
        with pytest.raises(ServerError) as refused:
            client.sandboxes.create(template="base")
        assert (refused.value.status, refused.value.code) == (503, "unavailable")
        message = refused.value.message
        assert "MiB available (MemAvailable)" in message, message
        assert f"{reserve} MiB stay in reserve (PANDASTACK_MEMORY_RESERVE_MB)" in message
        assert client.sandboxes.list() == []

    # E2B's REST create, in E2B's error shape.
    h = {"X-API-KEY": e2b_key(server.api_key)}
    r = httpx.post(f"{server.api_url}/sandboxes", headers=h, timeout=120,
                   json={"templateID": "base", "timeout": 60})
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["code"] == 503 and "MemAvailable" in body["message"], body
    assert f"{reserve} MiB stay in reserve" in body["message"]
    assert r.headers.get("Retry-After") == "5"
