"""Two API servers that keep no state, over two real agents registered in PostgreSQL, with
real microVMs: creates spread and every operation works through either server; a database
out of reach for a while gives clear 503s and loses nothing. (A SIGKILLed agent's sandboxes,
host_lost while creates go elsewhere, and the fenced VM it kills when it comes back: the
lost-host test of test_cluster_objects.py, on the sandboxes it has anyway.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.registry.proxy import TcpProxy
from tests.registry.test_agent_membership import record_state
from tests.server.conftest import assert_envelope
from tests.server.hosts.cluster_rig import (
    CALM_STALE_S,
    STALE_S,
    agents,
    api_servers,
    host_ids,
    registry_of,
    until,
)

pytestmark = pytest.mark.vm


# No host is lost in it: agents stale only after 60 s (CALM_STALE_S), so a heartbeat late
# beside a second test worker's VMs fences nothing, and it runs in the parallel lane.
async def test_two_api_servers_drive_two_agents(pg_dsn: str, tmp_path: Path) -> None:
    with registry_of(pg_dsn) as registry:
        async with agents(pg_dsn, 2, stale_s=CALM_STALE_S) as (a, b):
            ids = host_ids(registry, [a, b])
            async with api_servers(tmp_path, pg_dsn, a.token_file,
                                   stale_s=CALM_STALE_S) as (one, two):
                made = []
                for _ in range(2):
                    r = await one.client.post("/v1/sandboxes", json={})
                    assert r.status_code == 201, r.text
                    made.append(r.json())
                assert sorted(m["host_id"] for m in made) == sorted(ids)
                for info in made:
                    sid = info["id"]
                    r = await one.client.put(f"/v1/sandboxes/{sid}/files",
                                             params={"path": "/tmp/who"},
                                             content=sid.encode())
                    assert r.status_code == 200, r.text
                    # The other server finds it by its lease and reaches its host.
                    got = (await two.client.get(f"/v1/sandboxes/{sid}")).json()
                    assert got["host_id"] == info["host_id"] and got["state"] == "running"
                    r = await two.client.post(f"/v1/sandboxes/{sid}/exec",
                                              json={"cmd": ["cat", "/tmp/who"]})
                    assert r.status_code == 200 and r.json()["stdout"] == sid, r.text
                    assert (await two.client.post(f"/v1/sandboxes/{sid}/pause")).status_code \
                        == 200
                    assert (await one.client.post(f"/v1/sandboxes/{sid}/resume")).status_code \
                        == 200
                    # A same-host fork through the other server.
                    r = await two.client.post(f"/v1/sandboxes/{sid}/fork", json={"count": 1})
                    assert r.status_code == 201, r.text
                    child = r.json()["sandboxes"][0]
                    assert child["host_id"] == info["host_id"]
                    r = await one.client.post(f"/v1/sandboxes/{child['id']}/exec",
                                              json={"cmd": ["cat", "/tmp/who"]})
                    assert r.json()["stdout"] == sid, r.text
                    for gone in (child["id"], sid):
                        assert (await two.client.delete(f"/v1/sandboxes/{gone}")).status_code \
                            == 204
                        assert registry.lease_of(gone) is None
                # An admin pins to a host.
                r = await two.client.post("/v1/sandboxes", json={"host_id": ids[1]})
                assert r.status_code == 201 and r.json()["host_id"] == ids[1], r.text
                assert (await one.client.delete(f"/v1/sandboxes/{r.json()['id']}")
                        ).status_code == 204


# Its outage outlasts the 3 s stale window on purpose, and a late heartbeat beside a second
# test worker's VMs would fence a host: the serial lane.
@pytest.mark.serial
async def test_the_database_out_of_reach_gives_503s_and_loses_nothing(
        pg_dsn: str, tmp_path: Path) -> None:
    """API servers and agents reach PostgreSQL through a proxy that the test stops until the
    agents have paused their VMs (they cannot renew) and twice the stale window has gone by:
    requests answer 503 unavailable, and when the database is back everything goes on where
    it was: no host is fenced."""
    url = make_url(pg_dsn)
    proxy = TcpProxy((url.host or "127.0.0.1", int(url.port or 5432)))
    proxy.start()
    via_proxy = url.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        with registry_of(pg_dsn) as registry:
            async with agents(via_proxy, 2) as (a, b), \
                    api_servers(tmp_path, via_proxy, a.token_file) as (one, two):
                sids = []
                for _ in range(2):
                    r = await one.client.post("/v1/sandboxes", json={"persistent": True})
                    assert r.status_code == 201, r.text
                    sids.append(r.json()["id"])
                epochs = {h.id: h.epoch for h in registry.list_hosts()}

                proxy.stop()
                cut_at = time.monotonic()
                try:
                    for api in (one, two):
                        r = await api.client.get(f"/v1/sandboxes/{sids[0]}")
                        assert_envelope(r, 503, "unavailable")
                        assert "database" in r.json()["error"]["message"]
                        assert r.headers.get("retry-after")

                    async def paused_long_enough() -> bool:
                        states = [record_state(agent, sid) for agent in (a, b) for sid in sids]
                        return (states.count("paused") == len(sids)
                                and time.monotonic() - cut_at > 2 * STALE_S)
                    # (It was a fixed 10 s; what it is for is an outage past the stale window
                    # with the VMs paused, which this waits for.)
                    await until("the cut-off agents to pause their VMs", paused_long_enough)
                finally:
                    proxy.start()

                async def answers() -> bool:
                    for sid in sids:
                        r = await two.client.post(f"/v1/sandboxes/{sid}/exec",
                                                  json={"cmd": "true"})
                        if r.status_code != 200:
                            return False
                    return True
                await until("the sandboxes to answer again", answers, timeout=60)
                # Past the servers' grace: still nobody fenced, nothing lost.
                await asyncio.sleep(STALE_S + 1)
                assert {h.id: h.epoch for h in registry.list_hosts()} == epochs
                for sid in sids:
                    got = (await one.client.get(f"/v1/sandboxes/{sid}")).json()
                    assert got["state"] == "running", got
                    assert (await one.client.delete(f"/v1/sandboxes/{sid}")
                            ).status_code == 204
    finally:
        proxy.stop()
