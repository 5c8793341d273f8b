"""A handle owns the connections its first call opened; when that call fails there is no
handle, so the SDK must close them itself (a retry loop around a failing create would leak a
connection pool per try otherwise)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest

from pandastack.sdk import AsyncSandbox, Sandbox
from pandastack.sdk.errors import AuthError

REFUSED = {"error": {"code": "unauthorized", "message": "bad key"}}


class Refusing(httpx.BaseTransport):
    closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json=REFUSED)

    def close(self) -> None:
        self.closed = True


class AsyncRefusing(httpx.AsyncBaseTransport):
    closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json=REFUSED)

    async def aclose(self) -> None:
        self.closed = True


CALLS = [
    lambda cls, t: cls.create(api_url="http://api.test", api_key="k", transport=t),
    lambda cls, t: cls.get_or_create("work", api_url="http://api.test", api_key="k",
                                     transport=t),
    lambda cls, t: cls.connect("sbx-0123456789ab", api_url="http://api.test", api_key="k",
                               transport=t),
]


@pytest.mark.parametrize("call", CALLS, ids=["create", "get_or_create", "connect"])
def test_a_failed_first_call_closes_the_connections(
        call: Callable[[type[Sandbox], httpx.BaseTransport], object]) -> None:
    transport = Refusing()
    with pytest.raises(AuthError):
        call(Sandbox, transport)
    assert transport.closed


@pytest.mark.parametrize("call", CALLS, ids=["create", "get_or_create", "connect"])
async def test_async_a_failed_first_call_closes_the_connections(
        call: Callable[[type[AsyncSandbox], httpx.AsyncBaseTransport], Awaitable[object]]
        ) -> None:
    transport = AsyncRefusing()
    with pytest.raises(AuthError):
        await call(AsyncSandbox, transport)
    assert transport.closed
