"""API keys (admin only): create (the secret is shown once), list, revoke."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Path, Response

from pandastack.wire.resources import CreatedKey, CreateKey, KeyInfo, KeyList

from ..accounts.auth import AdminPrincipal, create_key
from ..store import ApiKey
from ..web.errors import bad_request, not_found
from ..web.jsonbody import StrictJsonRoute
from .deps import Service
from .links import links

router = APIRouter(tags=["keys"], route_class=StrictJsonRoute)

TEAM_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def to_key_info(row: ApiKey) -> KeyInfo:
    return KeyInfo(id=row.id, name=row.name, team=row.team, prefix=row.prefix,
                   created_at=row.created_at, revoked=row.revoked_at is not None)


@router.post("/keys", status_code=201, response_model=CreatedKey,
             responses=links(201, ("revokeApiKey",), {"key_id": "$response.body#/id"}),
             summary="Create a key (in the caller's team unless `team` is given)")
async def create_api_key(body: CreateKey, who: AdminPrincipal, service: Service) -> CreatedKey:
    team = body.team or who.team
    if not TEAM_RE.match(team):
        raise bad_request("team: letters, digits, '.', '_' and '-' only")
    row, secret = create_key(service.store, body.name, team)
    return CreatedKey(**to_key_info(row).model_dump(), key=secret)


@router.get("/keys", response_model=KeyList, summary="All keys of every team")
async def list_api_keys(who: AdminPrincipal, service: Service) -> KeyList:
    return KeyList(keys=[to_key_info(k) for k in service.store.list_keys()])


@router.delete("/keys/{key_id}", status_code=204, response_class=Response,
               summary="Revoke a key (idempotent)")
async def revoke_api_key(key_id: Annotated[str, Path(max_length=64)], who: AdminPrincipal,
                         service: Service) -> Response:
    if service.store.revoke_key(key_id) is None:
        raise not_found(f"key {key_id!r}")
    return Response(status_code=204)
