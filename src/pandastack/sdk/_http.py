"""The only code that touches the network: `HTTP` (on httpx.Client) and its twin `AsyncHTTP`.

Both send a `Call` built by `_base`, translate httpx errors into the SDK's, raise `APIError` for
non-2xx replies and decode the rest. `stream()` hands back a checked, still-open response.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any, TypeVar

import httpx

from pandastack.sdk._base import Call, client_headers, raise_for_status, transport_errors
from pandastack.sdk._tracing import traced_call
from pandastack.sdk.config import ClientConfig

T = TypeVar("T")
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's


@functools.cache
def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The verifying context of `ca_bundle` (None: the system's CAs)."""
    # httpx builds a verifying SSL context for every client (~18 ms: it loads the CA
    # bundle), even for http:// URLs; one per process (and bundle) is enough.
    return ssl.create_default_context(cafile=ca_bundle)


def _client_kwargs(config: ClientConfig) -> dict[str, Any]:
    return {"base_url": config.api_url, "headers": client_headers(config),
            "timeout": config.timeout, "follow_redirects": False,
            "verify": tls_context(config.ca_bundle)}


def _request_kwargs(call: Call[Any], default: httpx.Timeout, content: Any,
                    headers: Mapping[str, str] | None) -> dict[str, Any]:
    return {"params": call.params, "json": call.json,
            "content": call.content if content is None else content,
            "headers": headers, "timeout": call.timeout or default}


def _traced(call: Call[Any]) -> AbstractContextManager[Mapping[str, str] | None]:
    return traced_call(call.span, call.method, call.path, call.headers)


class HTTP:
    """Sends calls over one `httpx.Client` (connection pool)."""

    def __init__(self, config: ClientConfig, transport: httpx.BaseTransport | None = None,
                 limits: httpx.Limits = DEFAULT_LIMITS) -> None:
        self.config = config
        self._transport = transport
        self._limits = limits
        self._client = httpx.Client(transport=transport, limits=limits,
                                    **_client_kwargs(config))

    def sibling(self) -> HTTP:
        """A new connection pool to the same server, with the same settings."""
        return HTTP(self.config, self._transport, self._limits)

    @property
    def timeout(self) -> httpx.Timeout:
        return self.config.timeout

    def run(self, call: Call[T], content: Iterable[bytes] | None = None) -> T:
        """Send `call` (with `content` streamed as the body, if given) and decode the reply."""
        with transport_errors(call.label), _traced(call) as headers:
            response = self._client.request(
                call.method, call.path, **_request_kwargs(call, self.timeout, content, headers))
        raise_for_status(response)
        return call.decode(response)

    @contextmanager
    def stream(self, call: Call[Any],
               content: Iterable[bytes] | None = None) -> Iterator[httpx.Response]:
        """Send `call`; yield the 2xx response with its body unread. Errors are translated,
        including those raised while the caller iterates the body."""
        with transport_errors(call.label), _traced(call) as headers, self._client.stream(
                call.method, call.path,
                **_request_kwargs(call, self.timeout, content, headers)) as response:
            if not response.is_success:
                response.read()
                raise_for_status(response)
            yield response

    def close(self) -> None:
        self._client.close()


class AsyncHTTP:
    """Sends calls over one `httpx.AsyncClient` (connection pool)."""

    def __init__(self, config: ClientConfig, transport: httpx.AsyncBaseTransport | None = None,
                 limits: httpx.Limits = DEFAULT_LIMITS) -> None:
        self.config = config
        self._transport = transport
        self._limits = limits
        self._client = httpx.AsyncClient(transport=transport, limits=limits,
                                         **_client_kwargs(config))

    def sibling(self) -> AsyncHTTP:
        """A new connection pool to the same server, with the same settings."""
        return AsyncHTTP(self.config, self._transport, self._limits)

    @property
    def timeout(self) -> httpx.Timeout:
        return self.config.timeout

    async def run(self, call: Call[T], content: AsyncIterable[bytes] | None = None) -> T:
        """Send `call` (with `content` streamed as the body, if given) and decode the reply."""
        with transport_errors(call.label), _traced(call) as headers:
            response = await self._client.request(
                call.method, call.path, **_request_kwargs(call, self.timeout, content, headers))
        raise_for_status(response)
        return call.decode(response)

    @asynccontextmanager
    async def stream(self, call: Call[Any], content: AsyncIterable[bytes] | None = None
                     ) -> AsyncIterator[httpx.Response]:
        """Send `call`; yield the 2xx response with its body unread. Errors are translated,
        including those raised while the caller iterates the body."""
        with transport_errors(call.label), _traced(call) as headers:
            async with self._client.stream(
                    call.method, call.path,
                    **_request_kwargs(call, self.timeout, content, headers)) as response:
                if not response.is_success:
                    await response.aread()
                    raise_for_status(response)
                yield response

    async def aclose(self) -> None:
        await self._client.aclose()
