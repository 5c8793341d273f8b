"""API keys: `psk_` + 32 url-safe characters, stored only as their SHA-256; the FastAPI
dependencies that authenticate a request (Bearer or X-API-Key) and apply the rate limit."""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ..store import ApiKey, Store
from ..store.events import note_caller
from ..web.errors import ApiError

KEY_PREFIX = "psk_"
KEY_RANDOM_CHARS = 32
DISPLAY_PREFIX_CHARS = 12  # "psk_" + 8: enough to recognise a key in a list


@dataclass(frozen=True)
class Principal:
    key_id: str
    team: str
    admin: bool


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_CHARS * 3 // 4)[:KEY_RANDOM_CHARS]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def looks_like_key(key: str) -> bool:
    return (key.startswith(KEY_PREFIX) and len(key) == len(KEY_PREFIX) + KEY_RANDOM_CHARS
            and all(c.isalnum() or c in "-_" for c in key[len(KEY_PREFIX):]))


def new_api_key(name: str, team: str, *, admin: bool = False) -> tuple[ApiKey, str]:
    """A new key row and the secret (which is never stored)."""
    secret = generate_key()
    row = ApiKey(id="key_" + secrets.token_hex(8), team=team, name=name,
                 prefix=secret[:DISPLAY_PREFIX_CHARS], hash=hash_key(secret), admin=admin,
                 created_at=time.time(), revoked_at=None)
    return row, secret


def create_key(store: Store, name: str, team: str, *, admin: bool = False) -> tuple[ApiKey, str]:
    row, secret = new_api_key(name, team, admin=admin)
    store.add_key(row)
    return row, secret


def key_from_headers(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    api_key = request.headers.get("x-api-key")
    return api_key.strip() if api_key else None


def authenticate(store: Store, key: str | None) -> Principal:
    if not key:
        raise ApiError(401, "unauthorized", "missing API key (Authorization: Bearer psk_...)",
                       {"WWW-Authenticate": "Bearer"})
    row = store.key_by_hash(hash_key(key)) if looks_like_key(key) else None
    if row is None or row.revoked_at is not None:
        raise ApiError(401, "unauthorized", "invalid or revoked API key",
                       {"WWW-Authenticate": "Bearer"})
    return Principal(key_id=row.id, team=row.team, admin=row.admin)


# Where the dashboard (server/dashboard) puts the caller its session cookie stands for, before
# it hands a request to the API in process. Only code in this process can set a scope key; the
# dashboard strips the cookie, so no route ever authenticates one.
SESSION_PRINCIPAL = "pandastack.session_principal"


async def principal(request: Request) -> Principal:
    """Dependency: the authenticated caller (401 otherwise), rate limited per key (429)."""
    state = request.app.state
    who = request.scope.get(SESSION_PRINCIPAL)
    if not isinstance(who, Principal):
        who = authenticate(state.store, key_from_headers(request))
    note_caller(who.key_id, who.team)
    wait = state.rate_limiter.take(who.key_id)
    if wait > 0:
        raise ApiError(429, "rate_limited", "too many requests for this API key",
                       {"Retry-After": str(max(1, math.ceil(wait)))})
    return who


async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if not who.admin:
        raise ApiError(403, "forbidden", "this operation needs an admin key")
    return who


CurrentPrincipal = Annotated[Principal, Depends(principal)]
AdminPrincipal = Annotated[Principal, Depends(admin)]
