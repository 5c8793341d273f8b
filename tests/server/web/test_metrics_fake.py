"""Sandbox metrics and the Prometheus /metrics of the server and of the host API, over the
in-memory runtime: the route's state rules, what moves which series, and who may scrape.
The guest's own figures on a real VM: tests/server/api/test_api_vm.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pandastack.host.api import create_host_app
from pandastack.host.memory.admission import MemoryAdmission
from pandastack.hostport.errors import HostUnavailable
from pandastack.metrics_access import TOKEN_ENV, MetricsAccess, is_loopback
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape by (name, sorted labels); parsing fails on a bad format."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def scrape(client: httpx.AsyncClient, **headers: str) -> dict[
        tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


def op(name: str, operation: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({"operation": operation, **labels}.items()))


@pytest.fixture
async def runtime(tmp_path: Path) -> FakeRuntime:
    return FakeRuntime(tmp_path)


@pytest.fixture
async def api(tmp_path: Path, runtime: FakeRuntime) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), runtime) as a:
        yield a


async def new_sandbox(api: Api, **body: object) -> str:
    r = await api.client.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def test_get_metrics_reads_the_guest_and_wakes_nothing(api: Api,
                                                             runtime: FakeRuntime) -> None:
    sid = await new_sandbox(api, vcpus=2, memory_mb=1024)
    r = await api.client.get(f"/v1/sandboxes/{sid}/metrics", params={"window_ms": 50})
    assert r.status_code == 200, r.text
    m = r.json()
    assert set(m) == {"cpu_percent", "cpu_count", "memory_used_bytes", "memory_total_bytes",
                      "disk_used_bytes", "disk_total_bytes", "window_ms", "sampled_at"}
    assert (m["cpu_count"], m["memory_total_bytes"], m["window_ms"]) == (2, 1024 << 20, 50)
    assert m["sampled_at"] > 0
    for bad in (5, 2001, "x"):
        assert_envelope(await api.client.get(f"/v1/sandboxes/{sid}/metrics",
                                             params={"window_ms": bad}), 422)
    assert_envelope(await api.client.get("/v1/sandboxes/sbx-000000000000/metrics"), 404,
                    "not_found")

    assert (await api.client.post(f"/v1/sandboxes/{sid}/pause")).status_code == 200
    assert_envelope(await api.client.get(f"/v1/sandboxes/{sid}/metrics"), 409, "conflict")
    assert (await api.client.post(f"/v1/sandboxes/{sid}/resume")).status_code == 200

    assert (await api.client.post(f"/v1/sandboxes/{sid}/hibernate")).status_code == 200
    assert_envelope(await api.client.get(f"/v1/sandboxes/{sid}/metrics"), 409, "conflict")
    assert runtime.sandboxes[sid].state == "hibernated" and runtime.sandboxes[sid].wakes == 0
    assert (await api.client.get(f"/v1/sandboxes/{sid}")).json()["state"] == "hibernated"
    assert (await api.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204


async def test_server_metrics_move_with_creates_forks_wakes_and_errors(
        api: Api, runtime: FakeRuntime) -> None:
    before = await scrape(api.client)
    assert before[op("pandastack_sandbox_operation_seconds_count", "create")] == 0
    assert before[("pandastack_sandboxes", (("state", "running"),))] == 0

    sid = await new_sandbox(api, vcpus=2, memory_mb=1024)
    r = await api.client.post(f"/v1/sandboxes/{sid}/fork", json={"count": 2})
    assert r.status_code == 201, r.text
    children = [c["id"] for c in r.json()["sandboxes"]]
    assert (await api.client.post(f"/v1/sandboxes/{sid}/wake")).status_code == 200  # awake
    assert (await api.client.post(f"/v1/sandboxes/{sid}/hibernate")).status_code == 200
    r = await api.client.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"})  # wakes it
    assert r.status_code == 200, r.text
    assert_envelope(await api.client.get("/v1/sandboxes/sbx-000000000000"), 404)

    after = await scrape(api.client)
    for operation, count in (("create", 1), ("fork", 1), ("wake", 1)):
        assert after[op("pandastack_sandbox_operations_total", operation,
                        outcome="ok")] == count, operation
        assert after[op("pandastack_sandbox_operation_seconds_count", operation)] == count
    assert after[("pandastack_sandboxes", (("state", "running"),))] == 3
    assert after[("pandastack_sandbox_vcpus", ())] == 6
    assert after[("pandastack_sandbox_memory_mb", ())] == 3 * 1024
    assert after[("pandastack_host_used_vcpus", (("host", "local"),))] == 6
    assert after[("pandastack_host_vcpus", (("host", "local"),))] >= 1
    assert after[("pandastack_api_errors_total",
                  (("code", "not_found"), ("status", "404")))] == 1

    # A host out of reach: the wake fails, and each of its counts says so.
    assert (await api.client.post(f"/v1/sandboxes/{sid}/hibernate")).status_code == 200
    runtime.fail_wake = HostUnavailable("agent gone")
    assert_envelope(await api.client.post(f"/v1/sandboxes/{sid}/wake"), 503,
                    "host_unavailable")
    failed = await scrape(api.client)
    assert failed[op("pandastack_sandbox_operations_total", "wake", outcome="error")] == 1
    assert failed[op("pandastack_sandbox_operation_seconds_count", "wake")] == 2
    assert failed[("pandastack_host_unavailable_total", ())] == 1
    assert failed[("pandastack_api_errors_total",
                   (("code", "host_unavailable"), ("status", "503")))] == 1
    assert failed[("pandastack_sandboxes", (("state", "hibernated"),))] == 1
    runtime.fail_wake = None
    for s in (sid, *children):
        assert (await api.client.delete(f"/v1/sandboxes/{s}")).status_code == 204


async def test_two_apps_in_one_process_count_apart(tmp_path: Path) -> None:
    async with running_app(make_settings(tmp_path / "a"), FakeRuntime(tmp_path)) as a, \
            running_app(make_settings(tmp_path / "b"), FakeRuntime(tmp_path)) as b:
        sid = await new_sandbox(a)
        key = op("pandastack_sandbox_operations_total", "create", outcome="ok")
        assert (await scrape(a.client))[key] == 1
        assert (await scrape(b.client)).get(key, 0) == 0
        assert (await a.client.delete(f"/v1/sandboxes/{sid}")).status_code == 204


@pytest.mark.parametrize("bind", ["0.0.0.0", "10.1.2.3", "[::]"])
async def test_server_metrics_off_when_exposed_without_a_token(
        tmp_path: Path, bind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    async with running_app(make_settings(tmp_path, host=bind), FakeRuntime(tmp_path)) as api:
        assert_envelope(await api.client.get("/metrics"), 404, "not_found")


async def test_server_metrics_with_a_token(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-metrics")
    async with running_app(make_settings(tmp_path, host="0.0.0.0"),
                           FakeRuntime(tmp_path)) as api:
        # the API key is no metrics token, nor is a wrong one, nor none
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": "Basic s3cret-metrics"}):
            r = await api.client.get("/metrics", headers=headers)
            assert_envelope(r, 401, "unauthorized")
        r = await api.client.get("/metrics", headers={"Authorization": "Bearer wrong"})
        assert r.headers["www-authenticate"] == "Bearer"
        got = await scrape(api.client, Authorization="Bearer s3cret-metrics")
        assert ("pandastack_sandboxes", (("state", "running"),)) in got
        # the refusals are errors by code as well
        assert got[("pandastack_api_errors_total",
                    (("code", "unauthorized"), ("status", "401")))] == 4


def test_loopback_binds() -> None:
    for bind in ("127.0.0.1", "localhost", "::1", "[::1]:9", "127.0.0.1:8080",
                 "http://127.0.0.1:7000", "unix:/run/agent.sock"):
        assert is_loopback(bind), bind
    for bind in ("0.0.0.0", "::", "10.0.0.5:7000", "http://agent.lan:7000", "example.org"):
        assert not is_loopback(bind), bind


async def test_agent_metrics(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    admission = MemoryAdmission(1024, meminfo=lambda: (24_000, 5_000))
    starting = admission.reserve(40, "create sbx-x")
    app = create_host_app(runtime, "agent-token", metrics_access=MetricsAccess(loopback=True),
                          admission=admission)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        sandbox = await runtime.create(vcpus=2, memory_mb=256)
        r = await client.get(f"/v1/sandboxes/{sandbox.id}/metrics",
                             params={"window_ms": 20},
                             headers={"Authorization": "Bearer agent-token"})
        assert r.status_code == 200, r.text
        assert r.json()["memory_total_bytes"] == 256 << 20
        got = await scrape(client)  # loopback: no token
        assert got[("pandastack_agent_sandboxes", (("state", "running"),))] == 1
        assert got[op("pandastack_agent_operation_seconds_count", "getSandboxMetrics")] == 1
        assert got[("pandastack_agent_guest_channel_failures_total",
                    (("kind", "timeout"),))] >= 0
        assert got[("pandastack_agent_memory_total_bytes", ())] > 0
        # Memory admission (ADR 0050): its reserve, and a VM start under way.
        assert got[("pandastack_agent_memory_reserve_bytes", ())] == 1024 << 20
        assert got[("pandastack_agent_memory_reserved_bytes", ())] == 40 << 20
        starting.release()
        got = await scrape(client)
        assert got[("pandastack_agent_memory_reserved_bytes", ())] == 0

    closed = create_host_app(runtime, "agent-token")  # no access rule given: off
    async with httpx.AsyncClient(transport=httpx.ASGITransport(closed),
                                 base_url="http://agent") as client:
        assert (await client.get("/metrics")).status_code == 404
    tokened = create_host_app(runtime, "agent-token",
                              metrics_access=MetricsAccess(loopback=False, token="m"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(tokened),
                                 base_url="http://agent") as client:
        assert (await client.get("/metrics", headers={"Authorization": "Bearer agent-token"})
                ).status_code == 401
        await scrape(client, Authorization="Bearer m")
