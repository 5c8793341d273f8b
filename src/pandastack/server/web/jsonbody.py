"""JSON request bodies that are real Unicode. Python's JSON parser turns an escaped lone UTF-16
surrogate (`"\\ud800"`) into a `str` that cannot be encoded as UTF-8: it would pass validation
in some fields, then fail deep inside (the store, the guest, the response) as a 500. Every route
uses `StrictJsonRoute`, which refuses such a body with a 400 up front."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException


def has_lone_surrogate(value: object) -> bool:
    """Whether any string (value or key) anywhere in a decoded JSON document is not valid
    Unicode. Iterative, so a deeply nested document cannot blow the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            data = json.loads(await self.body())
            if has_lone_surrogate(data):
                # FastAPI re-raises HTTP exceptions met while reading the body (-> envelope)
                raise StarletteHTTPException(
                    400, "request body is not valid Unicode: it escapes a lone UTF-16 "
                         "surrogate (\\ud800-\\udfff)")
            self._json = data
        return self._json


class StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict_handler

