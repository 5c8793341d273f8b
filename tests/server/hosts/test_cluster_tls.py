"""Two real `pandastack agent` processes whose host API is mutual TLS (`--tls-cert
--tls-key --tls-client-ca`, certificates the test made with openssl) and two API servers
that dial them with the CA and their client certificate, on microVMs, PostgreSQL and the real
S3 server: a fork pinned to the other host streams the parent's state from agent to agent
(nothing of it in the object store), and a drain moves the running sandbox live, both over
the agents' own mutual TLS (ADR 0048, addendum), with the memory a process holds intact.
The bytes on those streams are checked in tests/host/runtime/test_runtime_streams_tls.py."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from pandastack.server.hosts.drain import drain
from tests.leftovers import owned_tmpdir
from tests.server.hostclient.test_agent_tls_vm import TLSAgent
from tests.server.hosts.cluster_rig import (
    CALM_STALE_S,
    HEARTBEAT_S,
    api_servers,
    registry_of,
    write_token,
)
from tests.server.hosts.test_cluster_objects import holder, ok, store_keys, store_url, told
from tests.server.live_agent import started
from tests.tls_certs import IssuedCerts, make_test_certs

pytestmark = [pytest.mark.vm, pytest.mark.serial, pytest.mark.timeout(900)]


class MemberAgent(TLSAgent):
    """On 127.0.0.1 over mutual TLS, registered at the database as https://127.0.0.1:PORT
    (the address other agents stream to, which the certificate names)."""

    def __init__(self, tmp: Path, certs: IssuedCerts, flags: Sequence[str]) -> None:
        super().__init__(tmp, certs)
        self.extra_args = [*self.extra_args, "--advertise", self.url, *flags]


@contextlib.asynccontextmanager
async def tls_agents(dsn: str, certs: IssuedCerts, flags: Sequence[str],
                     count: int = 2) -> AsyncIterator[list[MemberAgent]]:
    token = secrets.token_urlsafe(32)
    common = ["--db", dsn, "--heartbeat-s", str(HEARTBEAT_S), "--stale-after-s",
              str(CALM_STALE_S), *flags]
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for _ in range(count):
            agent = MemberAgent(owned_tmpdir("prg-"), certs, common)
            write_token(agent.token_file, token)
            out.append(await stack.enter_async_context(started(agent)))
        yield out


async def test_a_fork_and_a_drain_between_agents_over_mutual_tls(
        pg_dsn: str, tmp_path: Path, s3_env: dict[str, str]) -> None:
    certs = make_test_certs(tmp_path / "certs")
    with registry_of(pg_dsn) as registry:
        async with tls_agents(pg_dsn, certs, ["--object-store", store_url(s3_env)]) as (a, b), \
                api_servers(tmp_path, pg_dsn, a.token_file, stale_s=CALM_STALE_S,
                            agent_ca=certs.ca, agent_client_cert=certs.client.cert,
                            agent_client_key=certs.client.key) as (one, _two):
            by_endpoint = {h.endpoint: h.id for h in registry.list_hosts()}
            id_a, id_b = by_endpoint[a.url], by_endpoint[b.url]
            src = str((await ok(await one.client.post("/v1/sandboxes", json={
                "host_id": id_a, "ttl_seconds": 3600}), 201))["id"])
            pid, value = await holder(one, src)

            # A fork pinned to B: streamed from A's agent to B's, none of it in the store
            # (the template goes through it by content key: a snapshot put it there first).
            snap = await ok(await one.client.post(f"/v1/sandboxes/{src}/snapshots",
                                                  json={"name": "s"}), 201)
            stored = await asyncio.to_thread(store_keys, s3_env)
            forked = await ok(await one.client.post(f"/v1/sandboxes/{src}/fork", json={
                "count": 1, "host_id": id_b}), 201)
            child = forked["sandboxes"][0]  # type: ignore[index]
            assert child["host_id"] == id_b
            assert await told(one, child["id"], pid) == value
            assert await asyncio.to_thread(store_keys, s3_env) == stored
            r = await one.client.delete(f"/v1/snapshots/{snap['id']}")
            assert r.status_code == 204, r.text
            assert (await one.client.delete(f"/v1/sandboxes/{child['id']}")).status_code == 204

            # Drain A: the running sandbox goes on on B live, its memory streamed over TLS.
            report = await drain(one.app.state.service, id_a)
            assert report.moved == {src: id_b} and report.moved_live == [src], report
            assert await told(one, src, pid) == value
            assert (await one.client.delete(f"/v1/sandboxes/{src}")).status_code == 204
            await ok(await one.client.post(f"/v1/hosts/{id_a}/undrain"))
