"""Error decoding: every status to its exception, with the request id; transport failures."""

from __future__ import annotations

import builtins

import httpx
import pytest

import pandastack
from pandastack import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    AuthError,
    Client,
    ConfigError,
    ConflictError,
    InsufficientStorageError,
    InvalidRequestError,
    NotFoundError,
    PandastackError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitError,
    Sandbox,
    SandboxError,
    ServerError,
    TransportError,
    TransportTimeoutError,
    ValidationError,
    WaitTimeoutError,
)
from tests.sdk.fakes import API_KEY, API_URL, SANDBOX, FakeAPI, envelope, reply


def client_for(api: FakeAPI) -> Client:
    return Client(API_URL, API_KEY, transport=api.transport)


# status, code, the class raised, the issue's name that catches it
STATUSES = [
    (400, "bad_request", InvalidRequestError, InvalidRequestError),
    (401, "unauthorized", AuthenticationError, AuthError),
    (403, "forbidden", PermissionDeniedError, AuthError),
    (404, "not_found", NotFoundError, NotFoundError),
    (408, "timeout", WaitTimeoutError, pandastack.TimeoutError),
    (409, "conflict", ConflictError, SandboxError),
    (413, "payload_too_large", PayloadTooLargeError, InvalidRequestError),
    (418, "bad_request", APIError, APIError),
    (422, "validation_error", InvalidRequestError, InvalidRequestError),
    (429, "rate_limited", RateLimitError, RateLimitError),
    (500, "internal", ServerError, ServerError),
    (503, "unavailable", ServerError, ServerError),
    (507, "insufficient_storage", InsufficientStorageError, SandboxError),
]


@pytest.mark.parametrize(("status", "code", "cls", "family"), STATUSES)
def test_status_maps_to_exception(
    status: int, code: str, cls: type[APIError], family: type[PandastackError]
) -> None:
    api = FakeAPI().on(
        "GET", "/v1/sandboxes/sb-1", reply(status, envelope(code, "it went wrong", "req-42"))
    )
    with pytest.raises(cls) as info:
        client_for(api).sandboxes.get("sb-1")
    err = info.value
    assert type(err) is cls
    assert isinstance(err, family)
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
        with pytest.raises(InvalidRequestError) as info:
            sbx.exec("true", timeout_seconds=0)
        assert len(api.requests) == sent
    assert info.value.request_id is None
    assert "timeout_seconds" in info.value.message
    with pytest.raises(InvalidRequestError, match="memory_mb"):
        Sandbox.create(memory_mb=1, api_url=API_URL, api_key=API_KEY, transport=api.transport)


def test_connect_error_becomes_api_connection_error() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(APIConnectionError, match="connection refused") as info:
        Client(API_URL, API_KEY, transport=httpx.MockTransport(fail)).sandboxes.list()
    err = info.value
    assert isinstance(err.__cause__, httpx.ConnectError)
    assert not isinstance(err, pandastack.TimeoutError)
    assert not isinstance(err, builtins.TimeoutError)
    assert (err.status, err.code, err.request_id) == (None, None, None)


def test_client_timeout_is_a_timeout_error() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    with pytest.raises(pandastack.TimeoutError) as info:
        Client(API_URL, API_KEY, transport=httpx.MockTransport(fail)).sandboxes.list()
    err = info.value
    assert type(err) is TransportTimeoutError
    assert isinstance(err, APIConnectionError)  # no HTTP answer, like a refused connection
    assert isinstance(err, builtins.TimeoutError)
    assert not isinstance(err, APIError)
    assert isinstance(err.__cause__, httpx.ReadTimeout)
    assert (err.status, err.request_id) == (None, None)
    assert str(err) == "GET /v1/sandboxes: timed out (ReadTimeout)"


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
    assert issubclass(pandastack.TimeoutError, builtins.TimeoutError)
    assert pandastack.TimeoutError is not builtins.TimeoutError
    for cls in (WaitTimeoutError, TransportTimeoutError):
        assert issubclass(cls, pandastack.TimeoutError)
        assert issubclass(cls, builtins.TimeoutError)
    assert not issubclass(WaitTimeoutError, APIConnectionError)
    assert issubclass(WaitTimeoutError, APIError)


def test_the_issue_names_form_one_tree() -> None:
    issue_names = ["AuthError", "NotFoundError", "InvalidRequestError", "RateLimitError",
                   "SandboxError", "TimeoutError", "APIConnectionError", "ServerError"]
    for name in issue_names:
        cls = getattr(pandastack, name)
        assert issubclass(cls, PandastackError), name
        assert cls.__module__ == "pandastack.sdk.errors", name
        assert name in pandastack.__all__ and name in pandastack.sdk.__all__
    # the eight are distinct, and only the timeout one overlaps others (through its leaves)
    classes = [getattr(pandastack, n) for n in issue_names]
    assert len(set(classes)) == 8
    for a in classes:
        for b in classes:
            assert a is b or not issubclass(a, b), (a, b)
    for cls in (ConfigError, ProtocolError):
        assert issubclass(cls, PandastackError) and not issubclass(cls, APIError)


def test_old_names_are_kept() -> None:
    assert ValidationError is InvalidRequestError
    assert TransportError is APIConnectionError
    assert issubclass(AuthenticationError, AuthError)
    assert issubclass(PermissionDeniedError, AuthError)
    assert issubclass(ConflictError, SandboxError)
    assert issubclass(InsufficientStorageError, SandboxError)
    assert issubclass(PayloadTooLargeError, InvalidRequestError)
    assert issubclass(TransportTimeoutError, TransportError)  # as before
    assert not issubclass(InsufficientStorageError, ServerError)


def test_every_error_has_status_code_and_request_id() -> None:
    for err in (ConfigError("x"), ProtocolError("x"), APIConnectionError("x"),
                TransportTimeoutError("x")):
        assert (err.status, err.code, err.request_id) == (None, None, None)
    gone = NotFoundError("gone", status=404, code="not_found", request_id="r")
    assert (gone.status, gone.code, gone.request_id, gone.message) == (404, "not_found", "r",
                                                                       "gone")


def test_sdk_modules_do_not_shadow_the_builtin_timeout_error() -> None:
    # Only the errors module and the two export lists may bind the name.
    import pandastack.sdk as sdk_pkg

    for name in ("_base", "_http", "_sse", "async_sandbox", "client", "commands", "config",
                 "filesystem", "models", "sandbox"):
        module = __import__(f"pandastack.sdk.{name}", fromlist=["_"])
        assert "TimeoutError" not in vars(module), name
    assert sdk_pkg.TimeoutError is pandastack.TimeoutError


@pytest.mark.parametrize(
    ("code", "cls", "status"),
    [
        ("not_found", NotFoundError, 404),
        ("forbidden", PermissionDeniedError, 403),
        ("conflict", ConflictError, 409),
        ("insufficient_storage", InsufficientStorageError, 507),
        ("timeout", WaitTimeoutError, 408),
        ("internal", ServerError, 500),
        ("brand_new_code", ServerError, 500),
    ],
)
def test_error_event_maps_code_to_exception(code: str, cls: type[APIError], status: int) -> None:
    from pandastack.sdk._base import error_from_event

    err = error_from_event(f'{{"error": {{"code": "{code}", "message": "m", "request_id": "r"}}}}')
    assert type(err) is cls and err.status == status and err.request_id == "r"
