"""Error decoding: every status to its exception, with the request id; transport failures."""

from __future__ import annotations

import builtins

import httpx
import pytest

from pandastack import (
    APIError,
    AuthenticationError,
    Client,
    ConflictError,
    NotFoundError,
    PandastackError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitError,
    Sandbox,
    ServerError,
    TransportError,
    TransportTimeoutError,
    ValidationError,
    WaitTimeoutError,
)
from tests.sdk.fakes import API_KEY, API_URL, SANDBOX, FakeAPI, envelope, reply


def client_for(api: FakeAPI) -> Client:
    return Client(API_URL, API_KEY, transport=api.transport)


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "bad_request", ValidationError),
        (401, "unauthorized", AuthenticationError),
        (403, "forbidden", PermissionDeniedError),
        (404, "not_found", NotFoundError),
        (408, "timeout", WaitTimeoutError),
        (409, "conflict", ConflictError),
        (413, "payload_too_large", PayloadTooLargeError),
        (418, "bad_request", APIError),
        (422, "validation_error", ValidationError),
        (429, "rate_limited", RateLimitError),
        (500, "internal", ServerError),
        (503, "unavailable", ServerError),
        (507, "insufficient_storage", ServerError),
    ],
)
def test_status_maps_to_exception(status: int, code: str, cls: type[APIError]) -> None:
    api = FakeAPI().on(
        "GET", "/v1/sandboxes/sb-1", reply(status, envelope(code, "it went wrong", "req-42"))
    )
    with pytest.raises(cls) as info:
        client_for(api).sandboxes.get("sb-1")
    err = info.value
    assert type(err) is cls
    assert isinstance(err, APIError) and isinstance(err, PandastackError)
    assert (err.status, err.code, err.message, err.request_id) == (
        status,
        code,
        "it went wrong",
        "req-42",
    )
    assert "req-42" in str(err) and "it went wrong" in str(err)


def test_non_json_error_body_falls_back_to_status_and_header() -> None:
    api = FakeAPI().on(
        "GET",
        "/v1/sandboxes/sb-1",
        lambda r: httpx.Response(
            502, text="<html>bad gateway</html>", headers={"x-request-id": "hdr-7"}
        ),
    )
    with pytest.raises(ServerError) as info:
        client_for(api).sandboxes.get("sb-1")
    assert info.value.status == 502
    assert info.value.code == "unavailable"
    assert info.value.request_id == "hdr-7"
    assert "bad gateway" in info.value.message


def test_bare_error_string_is_understood() -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes/sb-1", reply(404, {"error": "no such sandbox"}))
    with pytest.raises(NotFoundError, match="no such sandbox") as info:
        client_for(api).sandboxes.get("sb-1")
    assert info.value.code == "not_found"


def test_rate_limit_carries_retry_after() -> None:
    api = FakeAPI().on(
        "GET",
        "/v1/sandboxes",
        reply(429, envelope("rate_limited", "slow down"), headers={"retry-after": "3"}),
    )
    with pytest.raises(RateLimitError) as info:
        client_for(api).sandboxes.list()
    assert info.value.retry_after == 3.0


def test_invalid_request_is_rejected_locally_before_sending() -> None:
    api = FakeAPI().with_sandbox()
    with Sandbox.create(api_url=API_URL, api_key=API_KEY, transport=api.transport) as sbx:
        sent = len(api.requests)
        with pytest.raises(ValidationError) as info:
            sbx.exec("true", timeout_seconds=0)
        assert len(api.requests) == sent
    assert info.value.request_id is None
    assert "timeout_seconds" in info.value.message
    with pytest.raises(ValidationError, match="memory_mb"):
        Sandbox.create(memory_mb=1, api_url=API_URL, api_key=API_KEY, transport=api.transport)


def test_connect_error_becomes_transport_error() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(TransportError, match="connection refused") as info:
        Client(API_URL, API_KEY, transport=httpx.MockTransport(fail)).sandboxes.list()
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert not isinstance(info.value, TransportTimeoutError)


def test_timeout_becomes_request_timeout_error() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    with pytest.raises(TransportTimeoutError) as info:
        Client(API_URL, API_KEY, transport=httpx.MockTransport(fail)).sandboxes.list()
    assert isinstance(info.value, TransportError)
    assert isinstance(info.value, builtins.TimeoutError)
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)


def test_success_reply_that_is_not_json_is_a_protocol_error() -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes/sb-1", lambda r: httpx.Response(200, text="ok"))
    with pytest.raises(ProtocolError, match="not JSON"):
        client_for(api).sandboxes.get("sb-1")


def test_success_reply_missing_fields_is_a_protocol_error() -> None:
    api = FakeAPI().on("GET", "/v1/sandboxes/sb-1", reply(200, {"id": "sb-1"}))
    with pytest.raises(ProtocolError, match="SandboxInfo"):
        client_for(api).sandboxes.get("sb-1")


def test_fields_added_by_a_newer_server_are_ignored() -> None:
    newer = {**SANDBOX, "gpu": "none", "network": {"ip": "10.0.0.2"}}
    api = FakeAPI().on(
        "GET", "/v1/sandboxes", reply(200, {"sandboxes": [newer], "next_cursor": None})
    )
    [info] = client_for(api).sandboxes.list()
    assert info.id == "sb-1"


def test_timeout_errors_are_builtin_timeout_errors() -> None:
    assert issubclass(WaitTimeoutError, builtins.TimeoutError)
    assert issubclass(TransportTimeoutError, builtins.TimeoutError)
    assert not issubclass(WaitTimeoutError, TransportError)


@pytest.mark.parametrize(
    ("code", "cls", "status"),
    [
        ("not_found", NotFoundError, 404),
        ("forbidden", PermissionDeniedError, 403),
        ("internal", ServerError, 500),
        ("brand_new_code", ServerError, 500),
    ],
)
def test_error_event_maps_code_to_exception(code: str, cls: type[APIError], status: int) -> None:
    from pandastack.sdk._base import error_from_event

    err = error_from_event(f'{{"error": {{"code": "{code}", "message": "m", "request_id": "r"}}}}')
    assert type(err) is cls and err.status == status and err.request_id == "r"
