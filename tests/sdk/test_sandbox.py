"""Sandbox and Client (sync): requests built, replies decoded, the context manager's kill."""

from __future__ import annotations

import logging

import httpx
import pytest

from pandastack import (
    Client,
    NotFoundError,
    Sandbox,
    SandboxError,
    SandboxInfo,
    TemplateBuildingError,
)
from tests.sdk.fakes import (
    API_KEY,
    API_URL,
    LIFECYCLE,
    SANDBOX,
    FakeAPI,
    body,
    envelope,
    reply,
)


def create(api: FakeAPI, **kwargs: object) -> Sandbox:
    return Sandbox.create(api_url=API_URL, api_key=API_KEY, transport=api.transport, **kwargs)  # type: ignore[arg-type]


def test_create_sends_the_wire_body_and_auth() -> None:
    api = FakeAPI().with_sandbox()
    sbx = create(
        api,
        template="code-interpreter",
        ttl_seconds=900,
        env={"A": "1"},
        metadata={"team": "x"},
        memory_mb=1024,
    )
    request = api.last("POST", "/v1/sandboxes")
    assert str(request.url) == f"{API_URL}/v1/sandboxes"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["user-agent"].startswith("pandastack-python/")
    assert body(request) == {
        "template": "code-interpreter",
        "ttl_seconds": 900,
        "persistent": False,
        "memory_mb": 1024,
        "env": {"A": "1"},
        "metadata": {"team": "x"},
    }
    assert sbx.id == "sb-1"
    assert isinstance(sbx.info, SandboxInfo) and sbx.info.state == "running"
    assert "sb-1" in repr(sbx)
    sbx.close()


def test_create_defaults_leave_resources_to_the_server() -> None:
    api = FakeAPI().with_sandbox()
    create(api).close()
    assert body(api.last("POST", "/v1/sandboxes")) == {"template": "base", "persistent": False}


def test_context_manager_kills_on_exit() -> None:
    api = FakeAPI().with_sandbox()
    with create(api) as sbx:
        assert sbx.id == "sb-1"
        assert api.calls("DELETE", "/v1/sandboxes/sb-1") == []
    assert len(api.calls("DELETE", "/v1/sandboxes/sb-1")) == 1


def test_context_manager_kills_on_exception_and_reraises() -> None:
    api = FakeAPI().with_sandbox()
    with pytest.raises(RuntimeError, match="model code blew up"), create(api):
        raise RuntimeError("model code blew up")
    assert len(api.calls("DELETE", "/v1/sandboxes/sb-1")) == 1


def test_failed_kill_does_not_mask_the_blocks_exception(caplog: pytest.LogCaptureFixture) -> None:
    api = (
        FakeAPI()
        .with_sandbox()
        .on("DELETE", "/v1/sandboxes/sb-1", reply(500, envelope("internal", "boom")))
    )
    with caplog.at_level(logging.WARNING, "pandastack"), pytest.raises(KeyError), create(api):
        raise KeyError("original")
    assert "could not kill sandbox sb-1" in caplog.text


def test_failed_kill_on_clean_exit_raises() -> None:
    api = (
        FakeAPI()
        .with_sandbox()
        .on("DELETE", "/v1/sandboxes/sb-1", reply(409, envelope("conflict", "busy")))
    )
    with pytest.raises(SandboxError), create(api):
        pass


def test_kill_is_idempotent_and_tolerates_a_vanished_sandbox() -> None:
    api = (
        FakeAPI()
        .with_sandbox()
        .on("DELETE", "/v1/sandboxes/sb-1", reply(404, envelope("not_found", "gone")))
    )
    with create(api) as sbx:
        sbx.kill()
        sbx.kill()
    assert len(api.calls("DELETE", "/v1/sandboxes/sb-1")) == 1


def test_connect_and_refresh() -> None:
    api = FakeAPI().with_sandbox()
    sbx = Sandbox.connect("sb-1", api_url=API_URL, api_key=API_KEY, transport=api.transport)
    assert sbx.info == SandboxInfo.model_validate(SANDBOX)
    api.on("GET", "/v1/sandboxes/sb-1", reply(200, {**SANDBOX, "state": "paused"}))
    assert sbx.refresh().state == "paused"
    assert sbx.info.state == "paused"
    sbx.close()


def test_connect_to_missing_sandbox() -> None:
    api = FakeAPI()
    with pytest.raises(NotFoundError):
        Sandbox.connect("nope", api_url=API_URL, api_key=API_KEY, transport=api.transport)


def test_list_builds_state_and_metadata_query() -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes", reply(200, {"sandboxes": [SANDBOX]}))
    infos = Sandbox.list(
        state="running",
        metadata={"team": "a b", "env": "prod"},
        api_url=API_URL,
        api_key=API_KEY,
        transport=api.transport,
    )
    assert [i.id for i in infos] == ["sb-1"]
    params = api.last("GET", "/v1/sandboxes").url.params
    assert dict(params) == {"state": "running", "metadata.team": "a b", "metadata.env": "prod"}


def test_list_asks_for_live_sandboxes_by_default() -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes", reply(200, {"sandboxes": []}))
    assert Sandbox.list(api_url=API_URL, api_key=API_KEY, transport=api.transport) == []
    assert api.last("GET", "/v1/sandboxes").url.query == b"include_ended=false"
    Sandbox.list(include_ended=True, api_url=API_URL, api_key=API_KEY, transport=api.transport)
    assert api.last("GET", "/v1/sandboxes").url.query == b""


def test_list_drops_ended_sandboxes_an_older_server_still_lists() -> None:
    ended = {**SANDBOX, "id": "sb-2", "state": "killed"}
    api = FakeAPI().on("GET", "/v1/sandboxes", reply(200, {"sandboxes": [SANDBOX, ended]}))
    client = Client(API_URL, API_KEY, transport=api.transport)
    assert [s.id for s in client.sandboxes.list()] == ["sb-1"]
    assert [s.id for s in client.sandboxes.list(include_ended=True)] == ["sb-1", "sb-2"]
    assert [s.id for s in client.sandboxes.list(state="killed")] == ["sb-1", "sb-2"]


def test_lifecycle_ttl_persistent_and_logs() -> None:
    path = "/v1/sandboxes/sb-1/lifecycle"
    api = (
        FakeAPI()
        .with_sandbox()
        .on("GET", path, reply(200, LIFECYCLE))
        .on("PATCH", path, reply(200, {**LIFECYCLE, "ttl_seconds": 60}))
        .on("GET", "/v1/sandboxes/sb-1/logs", reply(200, {"console": "boot", "agent": "ok"}))
    )
    with create(api) as sbx:
        assert sbx.lifecycle().idle_timeout_seconds == 600
        assert sbx.set_ttl(60).ttl_seconds == 60
        assert body(api.requests[-1]) == {"ttl_seconds": 60}
        sbx.set_persistent(True)
        assert body(api.requests[-1]) == {"persistent": True}
        assert api.requests[-1].method == "PATCH"
        assert sbx.logs().console == "boot"


def test_ids_are_percent_encoded_in_paths() -> None:
    api = FakeAPI()
    with pytest.raises(NotFoundError):
        Client(API_URL, API_KEY, transport=api.transport).sandboxes.get("../keys?x=1")
    assert api.requests[0].url.raw_path == b"/v1/sandboxes/..%2Fkeys%3Fx%3D1"


def test_api_url_with_a_path_prefix() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"sandboxes": []})

    Client(
        "https://gw.example/pandastack/", API_KEY, transport=httpx.MockTransport(handle)
    ).sandboxes.list()
    assert str(seen[0].url) == "https://gw.example/pandastack/v1/sandboxes?include_ended=false"


def test_client_sandboxes_share_the_clients_connections() -> None:
    api = FakeAPI().with_sandbox()
    with Client(API_URL, API_KEY, transport=api.transport) as client:
        assert client.api_url == API_URL
        sbx = client.sandboxes.create(ttl_seconds=60)
        assert client.sandboxes.get("sb-1").id == "sb-1"
        assert client.sandboxes.connect("sb-1").id == "sb-1"
        with sbx:
            pass  # kills, but must not close the client's pool
        client.sandboxes.kill("sb-1")
        assert len(api.calls("DELETE", "/v1/sandboxes/sb-1")) == 2


def test_client_keys() -> None:
    key = {"id": "k1", "name": "ci", "team": "t", "prefix": "psk_ab", "created_at": 1.0}
    api = (
        FakeAPI()
        .on("POST", "/v1/keys", reply(201, {**key, "key": "psk_ab.secret"}))
        .on("GET", "/v1/keys", reply(200, {"keys": [key]}))
        .on("DELETE", "/v1/keys/k1", reply(204))
    )
    keys = Client(API_URL, API_KEY, transport=api.transport).keys
    assert keys.create("ci").key == "psk_ab.secret"
    assert body(api.last("POST", "/v1/keys")) == {"name": "ci"}
    assert [k.id for k in keys.list()] == ["k1"]
    keys.revoke("k1")
    assert api.last("DELETE", "/v1/keys/k1")


def test_create_waits_while_the_template_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """409 template_building is not an error to the caller: create asks again as told."""
    slept: list[float] = []
    monkeypatch.setattr("pandastack.sdk.sandbox.time.sleep", slept.append)
    answers = iter([
        httpx.Response(409, json=envelope("template_building", "template node is building"),
                       headers={"Retry-After": "7"}),
        httpx.Response(409, json=envelope("template_building", "template node is building")),
        httpx.Response(201, json=SANDBOX),
    ])
    api = FakeAPI().with_sandbox().on("POST", "/v1/sandboxes", lambda request: next(answers))
    sbx = create(api, template="node")
    assert sbx.id == SANDBOX["id"]
    assert len(api.calls("POST", "/v1/sandboxes")) == 3
    assert slept == [7.0, 5.0]  # the server's hint, then the default


def test_create_gives_up_waiting_after_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pandastack.sdk._base.TEMPLATE_WAIT_SECONDS", 0.0)
    monkeypatch.setattr("pandastack.sdk.sandbox.time.sleep", lambda s: None)
    api = FakeAPI().on("POST", "/v1/sandboxes", reply(
        409, envelope("template_building", "still building"), {"Retry-After": "1"}))
    with pytest.raises(TemplateBuildingError) as caught:
        create(api, template="node")
    assert caught.value.retry_after == 1.0 and isinstance(caught.value, SandboxError)
