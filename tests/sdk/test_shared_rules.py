"""The SDK's exception table is the server's error codes, no more and no fewer, and an error
answer raises the class of its code (pandastack.rules holds the codes and their statuses)."""

from __future__ import annotations

import inspect
from typing import Any

import httpx
import pytest

from pandastack import rules
from pandastack.sdk import AsyncSandbox, Sandbox, errors
from pandastack.sdk._base import api_error, error_from_event, error_from_response
from pandastack.sdk.client import AsyncSandboxes, Sandboxes
from pandastack.wire.sandboxes import ErrorBody, ErrorEnvelope


def test_every_error_code_has_a_status_and_an_sdk_class() -> None:
    assert set(rules.ERROR_STATUS) == set(rules.ERROR_CODES)
    assert set(errors.CODE_EXCEPTIONS) == set(rules.ERROR_CODES), (
        "sdk/errors.py CODE_EXCEPTIONS must name exactly the server's ErrorCode values")
    assert all(issubclass(cls, errors.APIError) for cls in errors.CODE_EXCEPTIONS.values())


@pytest.mark.parametrize("code", rules.ERROR_CODES)
def test_an_enveloped_error_raises_its_codes_class(code: rules.ErrorCode) -> None:
    status = rules.ERROR_STATUS[code]
    body = ErrorEnvelope(error=ErrorBody(code=code, message="m", request_id="req_1"))
    response = httpx.Response(status, json=body.model_dump(),
                              request=httpx.Request("GET", "http://x/v1/sandboxes"))
    for exc in (error_from_response(response), error_from_event(body.model_dump_json())):
        assert type(exc) is errors.CODE_EXCEPTIONS[code]
        assert (exc.status, exc.code, exc.request_id) == (status, code, "req_1")


def test_a_bare_409_is_a_plain_conflict_not_a_template_build() -> None:
    """A 409 without an envelope (a proxy's) says nothing about a template being built."""
    exc = api_error(409, None, None, None)
    assert type(exc) is errors.ConflictError
    assert exc.code == "conflict"


def test_a_status_without_a_code_of_ours_raises_by_status() -> None:
    assert type(api_error(504, None, None, None)) is errors.ServerError
    assert type(api_error(418, None, None, None)) is errors.APIError
    assert type(api_error(404, "gone_fishing", "m", None)) is errors.NotFoundError


@pytest.mark.parametrize("create", [
    Sandbox.create, AsyncSandbox.create, Sandboxes.create, AsyncSandboxes.create])
def test_the_sdk_creates_from_the_default_template(create: Any) -> None:
    """The SDK's signatures spell the default out (for help() and editors); it is the rule's."""
    assert inspect.signature(create).parameters["template"].default == rules.DEFAULT_TEMPLATE
