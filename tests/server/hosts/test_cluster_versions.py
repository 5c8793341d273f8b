"""A real `pandastack agent` of another host API level (an older version, stood in by its
hidden `--host-protocol`) registered in PostgreSQL beside an API server of this one: the
server lists it `incompatible` with why, logs it, places nothing there and stays up; the
same agent restarted at this version (its upgrade) takes sandboxes again. No VM is booted:
nothing is placed."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

from pandastack.hostport.compat import OLDEST_HOST_PROTOCOL
from tests.server.conftest import assert_envelope
from tests.server.hosts.cluster_rig import CALM_STALE_S, agents, api_servers, registry_of, until

pytestmark = pytest.mark.vm  # a real agent: root, its network and jail set up


async def test_an_agent_two_levels_behind_is_incompatible_until_upgraded(
        pg_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = str(OLDEST_HOST_PROTOCOL - 1)
    with registry_of(pg_dsn) as registry, caplog.at_level(logging.INFO, "pandastack.server"):
        async with agents(pg_dsn, 1, stale_s=CALM_STALE_S, flags=("--host-protocol", old)
                          ) as (agent,):
            (host,) = registry.list_hosts()
            assert host.protocol == OLDEST_HOST_PROTOCOL - 1
            async with api_servers(tmp_path, pg_dsn, agent.token_file, count=1,
                                   stale_s=CALM_STALE_S) as (api,):
                r = await api.client.get(f"/v1/hosts/{host.id}")
                assert r.status_code == 200, r.text
                assert r.json()["state"] == "incompatible"
                assert r.json()["incompatible_reason"].endswith("upgrade the agent")
                assert any(f"host {host.id}" in m and "is incompatible" in m
                           for m in caplog.messages)
                r = await api.client.post("/v1/sandboxes", json={"ttl_seconds": 60})
                assert_envelope(r, 503, "unavailable")
                assert registry.host_leases(host.id) == []  # nothing was started there
                assert (await api.client.get("/health")).status_code == 200

                # Its upgrade: the same agent restarted at this version.
                assert agent.signal(signal.SIGTERM) == 0
                assert agent.extra_args[-2:] == ["--host-protocol", old]
                del agent.extra_args[-2:]
                agent.start()

                async def live() -> bool:
                    r = await api.client.get(f"/v1/hosts/{host.id}")
                    return bool(r.json()["state"] == "live")

                await until("the upgraded agent to be live", live)
                assert any(f"host {host.id}" in m and "is compatible again" in m
                           for m in caplog.messages)
