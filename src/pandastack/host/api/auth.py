"""The host API's one credential: the bearer token of the agent's token file, which only the
control plane holds. Compared in constant time."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

_BEARER = HTTPBearer(auto_error=False, description="the agent's token (`--token-file`)")


class Unauthorized(Exception):
    """No bearer token, or not the agent's (answered 401, type "Unauthorized")."""


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> None:
    expected: bytes = request.app.state.token
    given = credentials.credentials.encode() if credentials is not None else b""
    if not hmac.compare_digest(given, expected):
        raise Unauthorized("missing or wrong bearer token for the host agent")
