"""One agent's HTTP connection and the two shapes of call on it: a request answered by one
JSON body (or none), and a request answered by a stream of frames (`hostport.frames`)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from pandastack.hostport.errors import HostError, HostUnavailable
from pandastack.hostport.frames import Decoder, Frame, FrameError, Kind
from pandastack.hostport.host_api.codec import ErrorEnvelope, decode_error, load_json
from pandastack.tracing import headers as trace_headers

from .transport import Timeouts, parse_address, reaching

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
API = "/v1"


def api_path(*parts: str | int) -> str:
    """`/v1/...` with every part quoted (ids come from callers, not from us)."""
    return API + "".join("/" + quote(str(p), safe="") for p in parts)


def parse(kind: type[T], payload: bytes, address: str) -> T:
    """`payload` read as `kind` (a model or a result dataclass)."""
    try:
        return load_json(kind, payload)
    except ValidationError as exc:
        raise FrameError(f"host agent at {address} sent a {kind.__name__} that is not "
                         f"one: {exc.errors()[:1]}") from None


class FrameStream:
    """The frames of one streamed answer, the final one excepted: iterating ends at the
    body's end, with `result` set to the RESULT frame's payload, or raises the ERROR
    frame's error. A body that ends before its final frame was cut off (HostUnavailable)."""

    def __init__(self, response: httpx.Response, address: str) -> None:
        self._response = response
        self._address = address
        self.result = b""

    async def __aiter__(self) -> AsyncIterator[Frame]:
        decoder = Decoder()
        chunks = self._response.aiter_raw()
        final: Frame | None = None
        while True:
            with reaching(self._address):
                chunk = await anext(chunks, None)
            if chunk is None:
                break
            for frame in decoder.feed(chunk):
                if frame.final:
                    final = frame
                else:
                    yield frame
        decoder.end()
        if final is None:
            raise HostUnavailable(f"host agent at {self._address}: the stream ended before "
                                  "its result (the agent stopped?)")
        if final.kind is Kind.ERROR:
            raise decode_error(parse(ErrorEnvelope, final.payload, self._address).error)
        self.result = final.payload


class Caller:
    def __init__(self, url: str, token: str, timeouts: Timeouts,
                 tls: ssl.SSLContext | None = None) -> None:
        transport, base_url = parse_address(url, tls)
        self.address = url
        # For the WebSockets (terminals), which httpx does not open.
        self.token = token
        self.tls = tls
        self.timeouts = timeouts
        self.http = httpx.AsyncClient(transport=transport, base_url=base_url,
                                      headers={"Authorization": f"Bearer {token}"},
                                      timeout=timeouts.of(timeouts.lookup))

    async def aclose(self) -> None:
        await self.http.aclose()

    def _error(self, response: httpx.Response) -> Exception:
        if response.status_code == 401:
            return HostError(f"host agent at {self.address} refused the token (401): the "
                             "control plane's token file is not the agent's")
        try:
            return decode_error(load_json(ErrorEnvelope, response.content).error)
        except ValidationError:
            return HostError(f"host agent at {self.address} answered {response.status_code}: "
                             f"{response.text[:300]}")

    async def call(self, method: str, url: str, *, read: float | None,
                   json: BaseModel | None = None, params: dict[str, Any] | None = None,
                   content: Any = None) -> httpx.Response:
        body = None if json is None else json.model_dump(mode="json")
        with reaching(self.address):
            response = await self.http.request(method, url, json=body, params=params,
                                               content=content, headers=trace_headers(),
                                               timeout=self.timeouts.of(read))
        if response.status_code >= 400:
            raise self._error(response)
        return response

    async def model(self, model: type[M], method: str, url: str, *, read: float | None,
                    json: BaseModel | None = None, params: dict[str, Any] | None = None,
                    content: Any = None) -> M:
        response = await self.call(method, url, read=read, json=json, params=params,
                                   content=content)
        return parse(model, response.content, self.address)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, *, read: float | None,
                     json: BaseModel | None = None,
                     params: dict[str, Any] | None = None) -> AsyncIterator[FrameStream]:
        """The answer's frames. Leaving early closes the connection, which the agent takes
        as the caller gone: it cancels the operation."""
        body = None if json is None else json.model_dump(mode="json")
        request = self.http.build_request(method, url, json=body, params=params,
                                          headers=trace_headers(),
                                          timeout=self.timeouts.of(read))
        with reaching(self.address):
            response = await self.http.send(request, stream=True)
        try:
            if response.status_code != 200:
                with reaching(self.address):
                    await response.aread()
                raise self._error(response)
            yield FrameStream(response, self.address)
        finally:
            await response.aclose()
