"""E2B's REST API over the in-memory runtime: the shapes E2B's SDKs parse, E2B's error shape
for every kind of bad input, keys (ours and their `e2b_` alias), paging and filters, the state
mapping through pause and connect, and another team's sandboxes out of reach on every route.
The official SDK against real VMs is tests/e2e/test_e2b_rest.py."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TypedDict

import httpx
import pytest

from pandastack.server.compat.e2b.rest.base import e2b_key
from pandastack.server.compat.e2b.rest.states import STATES, alias_of, our_template
from pandastack.server.compat.e2b.target import ENVD_VERSION
from pandastack.server.compat.e2b.tokens import tokens_for
from pandastack.server.sandboxes.lifecycle import (
    HIBERNATE,
    SPENT,
    TIMEOUT_ONLY,
    Verdict,
    decide,
    sweep,
)
from pandastack.wire.sandboxes import ENDED_STATES
from tests.server.conftest import Api, make_settings, running_app
from tests.server.fakes import FakeRuntime

CREATED = {"templateID", "sandboxID", "clientID", "envdVersion", "alias", "envdAccessToken",
           "trafficAccessToken", "domain"}
LISTED = {"templateID", "alias", "sandboxID", "clientID", "startedAt", "endAt", "cpuCount",
          "memoryMB", "diskSizeMB", "metadata", "state", "envdVersion", "volumeMounts"}


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path, preview_port=18081),
                           FakeRuntime(tmp_path)) as a:
        yield a


def e2b(key: str) -> dict[str, str]:
    """The headers E2B's SDKs send: the key as X-API-KEY, no Authorization."""
    return {"Authorization": "", "X-API-KEY": key}


def assert_e2b_error(r: httpx.Response, status: int, words: str = "") -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == status, body
    assert words.lower() in body["message"].lower(), body


async def create(api: Api, key: str | None = None, **body: object) -> dict[str, str]:
    r = await api.client.post("/v2/sandboxes", json={"templateID": "base", **body},
                              headers=e2b(key or api.admin_key))
    assert r.status_code == 201, r.text
    data: dict[str, str] = r.json()
    return data


async def test_create_both_paths_answer_sandbox_shape_with_tokens(api: Api) -> None:
    tokens = tokens_for(api.app.state.store)
    for path, body in (("/v2/sandboxes", {"templateID": "base", "timeout": 60}),
                       # as e2b 2.45.1 sends it (NewSandbox, before /v2)
                       ("/sandboxes", {"templateID": "base", "timeout": 60, "secure": True,
                                       "autoPause": False, "metadata": {"k": "v"},
                                       "envVars": {"A": "1"}})):
        r = await api.client.post(path, json=body, headers=e2b(api.admin_key))
        assert r.status_code == 201, r.text
        got = r.json()
        assert set(got) == CREATED
        sid = got["sandboxID"]
        assert got["envdVersion"] == ENVD_VERSION
        assert got["envdAccessToken"] == tokens.envd_access(sid)
        assert got["trafficAccessToken"] == tokens.traffic_access(sid)
        assert got["domain"] == "localhost:18081"  # {port}-{id}.{domain} is the listener
        assert got["templateID"] == "base" and got["alias"] == "base"
    row = (await api.client.get(f"/v1/sandboxes/{sid}")).json()
    assert row["metadata"] == {"k": "v"} and 59 <= row["ttl_seconds"] <= 61


async def test_get_detail_and_timeout_from_now(api: Api) -> None:
    sid = (await create(api, timeout=30, metadata={"who": "me"}))["sandboxID"]
    r = await api.client.get(f"/sandboxes/{sid}", headers=e2b(api.admin_key))
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) >= LISTED and got["state"] == "running" and got["metadata"] == {"who": "me"}
    assert got["lifecycle"] == {"onTimeout": "kill", "autoResume": False}
    assert got["allowInternetAccess"] is True
    assert got["network"]["allowPublicTraffic"] is False
    r = await api.client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 1000},
                              headers=e2b(api.admin_key))
    assert r.status_code == 204, r.text
    end = (await api.client.get(f"/sandboxes/{sid}", headers=e2b(api.admin_key))).json()["endAt"]
    ends = time.mktime(time.strptime(end[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert abs(ends - (time.time() + 1000)) < 5
    # past its timeout it is gone to E2B at once, whether or not the reaper has ended it
    api.app.state.store.update_sandbox(sid, expires_at=time.time() - 0.1)
    assert_e2b_error(await api.client.get(f"/sandboxes/{sid}", headers=e2b(api.admin_key)),
                     404)


async def test_auto_pause_is_persistent_and_egress_maps(api: Api) -> None:
    sid = (await create(api, autoPause=True, autoResume={"enabled": True},
                        allow_internet_access=False,
                        network={"allowOut": ["1.1.1.1"], "dnsServers": ["8.8.8.8"]})
           )["sandboxID"]
    got = (await api.client.get(f"/sandboxes/{sid}", headers=e2b(api.admin_key))).json()
    assert got["lifecycle"] == {"onTimeout": "pause", "autoResume": True}
    # autoResume only with autoPause, as E2B says
    r = await api.client.post("/v2/sandboxes", json={"templateID": "base",
                                                     "autoResume": {"enabled": True}},
                              headers=e2b(api.admin_key))
    assert_e2b_error(r, 400, "autoResume needs autoPause")
    assert got["allowInternetAccess"] is False and got["network"]["allowOut"] == ["1.1.1.1"]
    assert got["network"]["denyOut"] == ["0.0.0.0/0"]
    net = (await api.client.get(f"/v1/sandboxes/{sid}/network")).json()
    assert net == {"internet": False, "allow_out": ["1.1.1.1"], "deny_out": []}
    # E2B's "deny everything" is ours with internet off; its allow list passes through it
    r = await api.client.put(f"/sandboxes/{sid}/network",
                             json={"denyOut": ["0.0.0.0/0", "9.9.9.9"], "allowOut": []},
                             headers=e2b(api.admin_key))
    assert r.status_code == 204, r.text
    net = (await api.client.get(f"/v1/sandboxes/{sid}/network")).json()
    assert net == {"internet": False, "allow_out": [], "deny_out": ["9.9.9.9"]}
    r = await api.client.put(f"/sandboxes/{sid}/network", json={"allowOut": ["10.0.0.0/8"]},
                             headers=e2b(api.admin_key))
    assert_e2b_error(r, 400, "10.0.0.0/8")  # our always-denied ranges stay closed


async def test_bad_bodies_are_e2b_400s(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    body: Mapping[str, object]
    for body, words in (({}, "templateID"), ({"templateID": 5}, "templateID"),
                        ({"templateID": "base", "bogus": 1}, "bogus"),
                        ({"templateID": "base", "timeout": -1}, "timeout"),
                        ({"templateID": "base", "metadata": {"k": 1}}, "metadata"),
                        ({"templateID": "base", "mcp": {"x": {}}}, "mcp"),
                        ({"templateID": "base", "network": {"allowPublicTraffic": True}},
                         "allowPublicTraffic"),
                        ({"templateID": "base", "network": {"rules": {"a.com": []}}}, "rules"),
                        ({"templateID": "base", "network": {"allowOut": ["x" * 300]}},
                         "allow_out"),
                        ({"templateID": "base", "envVars": {"A": "\x00"}}, "")):
        assert_e2b_error(await c.post("/v2/sandboxes", json=body, headers=h), 400, words)
    r = await c.post("/v2/sandboxes", content=b"{not json", headers={
        **h, "Content-Type": "application/json"})
    assert_e2b_error(r, 400, "json")
    r = await c.post("/v2/sandboxes", content=b'{"templateID": "\\ud800"}',
                     headers={**h, "Content-Type": "application/json"})
    assert_e2b_error(r, 400, "unicode")
    assert_e2b_error(await c.post("/v2/sandboxes", json={"templateID": "nope"}, headers=h),
                     404, "nope")
    sid = (await create(api))["sandboxID"]
    for path, body in ((f"/sandboxes/{sid}/timeout", {}),
                       (f"/sandboxes/{sid}/timeout", {"timeout": "soon"}),
                       (f"/sandboxes/{sid}/connect", {}),
                       (f"/sandboxes/{sid}/fork", {"count": 99}),
                       (f"/v2/sandboxes/{sid}/connect", {"timeout": -5})):
        assert_e2b_error(await c.post(path, json=body, headers=h), 400)
    for query in ("state=dead", "metadata=%%%", "nextToken=garbage", "startedAfter=yesterday",
                  "limit=0", "order=sideways"):
        assert_e2b_error(await c.get(f"/v2/sandboxes?{query}", headers=h), 400)


async def test_auth_and_the_e2b_key_alias(api: Api) -> None:
    c = api.client
    assert_e2b_error(await c.get("/v2/sandboxes", headers={"Authorization": ""}), 401)
    assert_e2b_error(await c.get("/v2/sandboxes", headers=e2b("e2b_" + "0" * 40)), 401)
    assert_e2b_error(await c.get("/v2/sandboxes", headers=e2b("e2b_zz")), 401)
    alias = e2b_key(api.admin_key)
    assert alias.startswith("e2b_") and all(ch in "0123456789abcdef" for ch in alias[4:])
    sid = (await create(api, key=alias))["sandboxID"]
    r = await c.get(f"/sandboxes/{sid}", headers=e2b(alias))
    assert r.status_code == 200


async def test_unsupported_and_unknown_routes(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    for method, path in (("GET", "/templates"), ("POST", "/v3/templates"),
                         ("GET", "/v2/templates/x"), ("POST", "/secrets"), ("GET", "/volumes"),
                         ("GET", "/teams"), ("POST", "/access-tokens"), ("GET", "/api-keys"),
                         ("GET", "/v2/sandboxes/sbx-000000000000/logs"),
                         ("DELETE", "/templates/base")):
        assert_e2b_error(await c.request(method, path, headers=h), 501, "not supported")
    for method, path in (("GET", "/v2/nothing"), ("PATCH", "/sandboxes"),
                         ("GET", "/sandboxes/sbx-000000000000/timeout"), ("GET", "/v3")):
        assert_e2b_error(await c.request(method, path, headers=h), 404, "no E2B route")
    spec = (await c.get("/openapi.json")).json()  # E2B's shapes never enter our contract
    assert all(p.startswith("/v1/") or p in ("/health",) for p in spec["paths"]), spec["paths"]


async def test_list_filters_and_pages(tmp_path: Path, db: str) -> None:
    async with running_app(make_settings(tmp_path, db_url=db), FakeRuntime(tmp_path)) as api:
        c, h = api.client, e2b(api.admin_key)
        mine = [(await create(api, metadata={"job": "a&b=c", "n": str(i)}))["sandboxID"]
                for i in range(5)]
        other = (await create(api, metadata={"job": "other"}))["sandboxID"]
        # encoded as the SDK encodes it: each key and value quoted, then the pairs urlencoded
        query = urllib.parse.urlencode({urllib.parse.quote("job"): urllib.parse.quote("a&b=c")})

        async def pages(order: str | None) -> list[list[str]]:
            got: list[list[str]] = []
            token: str | None = None
            while True:
                params = {"metadata": query, "limit": "2", **({"order": order} if order else {}),
                          **({"nextToken": token} if token else {})}
                r = await c.get("/v2/sandboxes", params=params, headers=h)
                assert r.status_code == 200, r.text
                assert all(set(s) == LISTED and s["state"] == "running" for s in r.json())
                got.append([s["sandboxID"] for s in r.json()])
                token = r.headers.get("x-next-token")
                if token is None:
                    return got

        newest = mine[::-1]  # E2B's default order: newest first
        assert await pages(None) == await pages("desc") == [newest[:2], newest[2:4], newest[4:]]
        assert await pages("asc") == [mine[:2], mine[2:4], mine[4:]]
        assert other in [s["sandboxID"] for s in (await c.get("/sandboxes", headers=h)).json()]
        await c.post(f"/sandboxes/{mine[0]}/pause", json={}, headers=h)
        r = await c.get("/v2/sandboxes", params={"state": "paused"}, headers=h)
        assert [(s["sandboxID"], s["state"]) for s in r.json()] == [(mine[0], "paused")]
        r = await c.get("/v2/sandboxes", params={"state": "running,paused"}, headers=h)
        assert len(r.json()) == 6
        await c.delete(f"/sandboxes/{other}", headers=h)  # ended: never listed
        assert other not in [s["sandboxID"] for s in
                             (await c.get("/v2/sandboxes", headers=h)).json()]


async def test_pause_connect_resume_and_kill(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    sid = (await create(api, timeout=60))["sandboxID"]
    assert (await c.post(f"/sandboxes/{sid}/pause", json={"memory": True},
                         headers=h)).status_code == 204
    assert (await c.get(f"/v1/sandboxes/{sid}")).json()["state"] == "hibernated"
    assert_e2b_error(await c.post(f"/sandboxes/{sid}/pause", headers=h), 409, "paused")
    r = await c.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 500}, headers=h)
    assert r.status_code == 201 and set(r.json()) == CREATED, r.text  # it had to wake
    assert (await c.get(f"/v1/sandboxes/{sid}")).json()["state"] == "running"
    r = await c.post(f"/sandboxes/{sid}/connect", json={"timeout": 10}, headers=h)
    assert r.status_code == 200, r.text
    life = (await c.get(f"/v1/sandboxes/{sid}/lifecycle")).json()
    assert life["expires_at"] > time.time() + 400  # connect only extends
    assert_e2b_error(await c.post(f"/sandboxes/{sid}/resume", json={}, headers=h), 409)
    await c.post(f"/v1/sandboxes/{sid}/pause")  # ours: vCPUs stopped, E2B's paused too
    r = await c.post(f"/sandboxes/{sid}/resume", json={"timeout": 100}, headers=h)
    assert r.status_code == 201, r.text
    assert (await c.delete(f"/sandboxes/{sid}", headers=h)).status_code == 204
    assert_e2b_error(await c.get(f"/sandboxes/{sid}", headers=h), 404)
    assert_e2b_error(await c.delete(f"/sandboxes/{sid}", headers=h), 404)
    assert_e2b_error(await c.post(f"/v2/sandboxes/{sid}/connect", json={}, headers=h), 404)


async def test_fork_snapshots_and_metrics(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    sid = (await create(api, metadata={"m": "1"}))["sandboxID"]
    r = await c.post(f"/sandboxes/{sid}/fork", json={"count": 2, "timeout": 90}, headers=h)
    assert r.status_code == 201, r.text
    children = [item["sandbox"] for item in r.json()]
    assert len(children) == 2 and all(set(s) == CREATED for s in children)
    life = (await c.get(f"/v1/sandboxes/{children[0]['sandboxID']}/lifecycle")).json()
    assert abs(life["expires_at"] - (time.time() + 90)) < 5
    r = await c.post(f"/sandboxes/{sid}/snapshots", json={"name": "snappy"}, headers=h)
    assert r.status_code == 201, r.text
    snap = r.json()
    assert snap["names"] == ["snappy"] and snap["snapshotID"].startswith("snap-")
    await c.post(f"/sandboxes/{sid}/snapshots", json={}, headers=h)
    r = await c.get("/snapshots", params={"sandboxID": sid, "limit": 1}, headers=h)
    assert [s["snapshotID"] for s in r.json()] == [snap["snapshotID"]]
    r = await c.get("/snapshots", params={"nextToken": r.headers["x-next-token"]}, headers=h)
    assert len(r.json()) == 1 and "x-next-token" not in r.headers
    # E2B creates from a snapshot by naming it as the template
    made = await create(api, templateID=snap["snapshotID"])
    assert (await c.get(f"/v1/sandboxes/{made['sandboxID']}")).json()["snapshot"] == \
        snap["snapshotID"]
    r = await c.get(f"/sandboxes/{sid}/metrics", headers=h)
    assert r.status_code == 200 and len(r.json()) == 1 and r.json()[0]["cpuCount"] == 1
    now = int(time.time())
    r = await c.get(f"/sandboxes/{sid}/metrics", params={"start": now - 60, "end": now},
                    headers=h)
    assert len(r.json()) == 1
    r = await c.get(f"/sandboxes/{sid}/metrics", params={"start": now - 3600,
                                                         "end": now - 1800}, headers=h)
    assert r.json() == []  # a range that does not hold now has no sample
    r = await c.get("/sandboxes/metrics", params={"sandbox_ids": f"{sid},sbx-000000000000"},
                    headers=h)
    assert list(r.json()["sandboxes"]) == [sid]
    await c.post(f"/sandboxes/{sid}/pause", headers=h)
    assert (await c.get(f"/sandboxes/{sid}/metrics", headers=h)).json() == []  # not woken
    assert (await c.get(f"/v1/sandboxes/{sid}")).json()["state"] == "hibernated"
    assert (await c.delete(f"/templates/{snap['snapshotID']}", headers=h)).status_code == 204
    assert_e2b_error(await c.delete(f"/templates/{snap['snapshotID']}", headers=h), 404)


async def test_another_teams_key_gets_404_everywhere(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    sid = (await create(api))["sandboxID"]
    snap = (await c.post(f"/sandboxes/{sid}/snapshots", json={}, headers=h)).json()
    other = e2b(await api.new_key("team-b"))
    for method, path, body in (
            ("GET", f"/sandboxes/{sid}", None), ("DELETE", f"/sandboxes/{sid}", None),
            ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 5}),
            ("POST", f"/sandboxes/{sid}/refreshes", {"duration": 5}),
            ("POST", f"/sandboxes/{sid}/pause", {}),
            ("POST", f"/sandboxes/{sid}/connect", {"timeout": 5}),
            ("POST", f"/v2/sandboxes/{sid}/connect", {}),
            ("POST", f"/sandboxes/{sid}/resume", {}),
            ("POST", f"/sandboxes/{sid}/fork", {}),
            ("POST", f"/sandboxes/{sid}/snapshots", {}),
            ("GET", f"/sandboxes/{sid}/metrics", None),
            ("PUT", f"/sandboxes/{sid}/network", {"allowOut": []}),
            ("DELETE", f"/templates/{snap['snapshotID']}", None),
            ("POST", "/v2/sandboxes", {"templateID": snap["snapshotID"]})):
        assert_e2b_error(await c.request(method, path, json=body, headers=other), 404)
    assert (await c.get("/v2/sandboxes", headers=other)).json() == []
    assert (await c.get("/snapshots", headers=other)).json() == []
    r = await c.get("/sandboxes/metrics", params={"sandbox_ids": sid}, headers=other)
    assert r.json() == {"sandboxes": {}}
    assert (await c.get(f"/v1/sandboxes/{sid}")).json()["state"] == "running"


async def test_quota_is_e2b_429(api: Api) -> None:
    c = api.client
    assert (await c.put("/v1/teams/small/quota", json={"max_sandboxes": 1})).status_code == 200
    key = await api.new_key("small")
    await create(api, key=key)
    r = await c.post("/v2/sandboxes", json={"templateID": "base"}, headers=e2b(key))
    assert_e2b_error(r, 429, "max_sandboxes")


def test_state_and_template_tables() -> None:
    assert set(STATES) | ENDED_STATES == {"starting", "running", "paused", "hibernated",
                                          "stopped", "host_lost", "killed", "expired",
                                          "reaped", "failed"}
    assert not set(STATES) & ENDED_STATES
    assert our_template("code-interpreter-v1") == "code-interpreter"
    assert our_template("base:latest") == "base" and our_template("mine:3") == "mine:3"
    assert alias_of("code-interpreter") == "code-interpreter-v1" and alias_of("x:2") == "x"


async def test_volume_mounts_are_our_volumes_by_name(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    assert (await c.post("/v1/volumes", json={"name": "data", "size_mb": 64})).status_code == 201
    sid = (await create(api, volumeMounts=[{"name": "data", "path": "/mnt/data"}]))["sandboxID"]
    got = (await c.get(f"/sandboxes/{sid}", headers=h)).json()
    assert got["volumeMounts"] == [{"name": "data", "path": "/mnt/data"}]
    listed = (await c.get("/v2/sandboxes", headers=h)).json()
    assert listed[0]["volumeMounts"] == [{"name": "data", "path": "/mnt/data"}]
    for mounts, status in (([{"name": "nope", "path": "/mnt/x"}], 404),
                           ([{"name": "data", "path": "relative"}], 400),
                           ([{"name": "data"}], 400)):
        r = await c.post("/v2/sandboxes", json={"templateID": "base", "volumeMounts": mounts},
                         headers=h)
        assert_e2b_error(r, status)


class SandboxFacts(TypedDict):
    """What `decide` reads of a sandbox, besides the time and its on_expiry."""
    state: str
    persistent: bool
    expires_at: float | None
    last_activity_at: float
    busy: bool
    idle_timeout: float


def verdict_state(verdict: Verdict | None) -> str:
    assert verdict is not None
    return verdict.state


def test_decide_hibernates_what_on_expiry_keeps() -> None:
    base: SandboxFacts = {"state": "running", "persistent": False, "expires_at": 100.0,
                          "last_activity_at": 50.0, "busy": False, "idle_timeout": 600.0}
    assert verdict_state(decide(**base, now=101.0)) == "expired"
    assert verdict_state(decide(**base, now=101.0, on_expiry=HIBERNATE)) == HIBERNATE
    assert decide(**base, now=101.0, on_expiry=SPENT) is None  # its TTL had its say
    # the idle rule hibernates it too, spent or not, and never ends it
    idle: SandboxFacts = {**base, "expires_at": 1000.0}
    assert verdict_state(decide(**idle, now=700.0, on_expiry=HIBERNATE)) == HIBERNATE
    assert verdict_state(decide(**base, now=700.0, on_expiry=SPENT)) == HIBERNATE
    assert verdict_state(decide(**idle, now=700.0)) == "reaped"
    for state in ("hibernated", "stopped", "host_lost"):  # kept past the TTL
        kept: SandboxFacts = {**base, "state": state}
        assert decide(**kept, now=1e9, on_expiry=HIBERNATE) is None
    # E2B's on_timeout kill: its timeout is its lifetime, the idle rule does not apply
    assert decide(**idle, now=700.0, on_expiry=TIMEOUT_ONLY) is None
    assert verdict_state(decide(**base, now=101.0, on_expiry=TIMEOUT_ONLY)) == "expired"


async def test_auto_pause_hibernates_at_timeout_and_connect_rearms(tmp_path: Path) -> None:
    # The reaper's own passes wait an hour: the test drives sweep() with its own clock.
    async with running_app(make_settings(tmp_path, reaper_interval_seconds=3600),
                           FakeRuntime(tmp_path)) as api:
        c, h = api.client, e2b(api.admin_key)
        service = api.app.state.service
        kept = (await create(api, timeout=30, autoPause=True))["sandboxID"]
        ends = (await create(api, timeout=30))["sandboxID"]
        got = (await c.get(f"/sandboxes/{kept}", headers=h)).json()
        assert got["lifecycle"] == {"onTimeout": "pause", "autoResume": False}
        await sweep(service, now=time.time() + 60)
        assert (await c.get(f"/v1/sandboxes/{kept}")).json()["state"] == "hibernated"
        assert (await c.get(f"/v1/sandboxes/{ends}")).json()["state"] == "expired"
        assert_e2b_error(await c.get(f"/sandboxes/{ends}", headers=h), 404)
        await sweep(service, now=time.time() + 3600)  # kept, however long past its TTL
        got = (await c.get(f"/sandboxes/{kept}", headers=h)).json()
        assert got["state"] == "paused"
        # woken without a new timeout (as a call to its daemon wakes it): not hibernated
        # again by the TTL it spent, only by the idle rule
        assert (await c.post(f"/v1/sandboxes/{kept}/wake")).status_code == 200
        await sweep(service, now=time.time() + 60)
        assert (await c.get(f"/v1/sandboxes/{kept}")).json()["state"] == "running"
        await sweep(service, now=time.time() + 3600)
        assert (await c.get(f"/v1/sandboxes/{kept}")).json()["state"] == "hibernated"
        # connect wakes it with a new timeout, which hibernates it again when it passes
        r = await c.post(f"/v2/sandboxes/{kept}/connect", json={"timeout": 30}, headers=h)
        assert r.status_code == 201, r.text
        await sweep(service, now=time.time() + 10)
        assert (await c.get(f"/v1/sandboxes/{kept}")).json()["state"] == "running"
        await sweep(service, now=time.time() + 60)
        assert (await c.get(f"/v1/sandboxes/{kept}")).json()["state"] == "hibernated"
        # its forks are autoPause sandboxes too
        r = await c.post(f"/sandboxes/{kept}/fork", json={"timeout": 30}, headers=h)
        child = r.json()[0]["sandbox"]["sandboxID"]
        got = (await c.get(f"/sandboxes/{child}", headers=h)).json()
        assert got["lifecycle"] == {"onTimeout": "pause", "autoResume": False}
        await sweep(service, now=time.time() + 60)
        assert (await c.get(f"/v1/sandboxes/{child}")).json()["state"] == "hibernated"


async def test_junk_on_every_route_is_a_4xx(api: Api) -> None:
    c, h = api.client, e2b(api.admin_key)
    sid = (await create(api))["sandboxID"]
    routes = [("POST", "/v2/sandboxes"), ("POST", "/sandboxes"),
              ("POST", f"/sandboxes/{sid}/timeout"), ("POST", f"/sandboxes/{sid}/refreshes"),
              ("POST", f"/sandboxes/{sid}/pause"), ("POST", f"/sandboxes/{sid}/connect"),
              ("POST", f"/v2/sandboxes/{sid}/connect"), ("POST", f"/sandboxes/{sid}/resume"),
              ("POST", f"/sandboxes/{sid}/fork"), ("POST", f"/sandboxes/{sid}/snapshots"),
              ("PUT", f"/sandboxes/{sid}/network")]
    junk: list[bytes] = [b"[]", b'"x"', b"1e999", b'{"timeout": 1e999}',
                         b'{"timeout": true}', b'{"count": "2"}', b"[" * 5000 + b"]" * 5000,
                         b'{"templateID": "base", "network": {"allowOut": [1]}}',
                         b'{"templateID": "base", "volumeMounts": [{"name": "\\u0000", '
                         b'"path": "/x"}]}', b"\xff\xfe"]
    for method, path in routes:
        for body in junk:
            r = await c.request(method, path, content=body,
                                headers={**h, "Content-Type": "application/json"})
            assert 400 <= r.status_code < 500, (method, path, body[:40], r.text)
            assert set(r.json()) == {"code", "message"}, r.text
    for query in ("limit=abc", "state=%00", "metadata=%ff%fe", "startedAfter=2026-13-45",
                  "nextToken=" + "x" * 600, "template=" + "t" * 200):
        r = await c.get(f"/v2/sandboxes?{query}", headers=h)
        assert r.status_code == 400 and set(r.json()) == {"code", "message"}, (query, r.text)
    for path in (f"/sandboxes/{'x' * 100}", "/sandboxes/sbx-%00", "/sandboxes/metrics"):
        r = await c.get(path, headers=h)
        assert r.status_code in (400, 404) and set(r.json()) == {"code", "message"}, r.text
