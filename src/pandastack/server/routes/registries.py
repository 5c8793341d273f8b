"""The team's registry credentials: store (log in), list (without passwords), delete (log
out). Template builds FROM an image of a registry the team logged in to pull with them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from pandastack.templatespec.registry_host import MAX_REGISTRY_LENGTH
from pandastack.wire.registries import (
    MAX_REGISTRY_CREDENTIALS_PER_TEAM,
    RegistryCredentials,
    RegistryCredentialsList,
    RegistryLogin,
)

from ..accounts.auth import CurrentPrincipal
from ..registries.service import RegistryCredentialService, registry_param
from ..store.registry_credentials import RegistryCredential
from ..web.jsonbody import StrictJsonRoute

router = APIRouter(tags=["registries"], route_class=StrictJsonRoute)

RegistryName = Annotated[str, Path(max_length=MAX_REGISTRY_LENGTH, description=(
    "registry host[:port], e.g. ghcr.io, docker.io (Docker Hub), registry.example.com:5000"))]

PUT_DESCRIPTION = f"""Stores the team's username and password (or access token) for a
registry, replacing any it had. Template builds FROM an image of that registry pull with them
(basic auth, or the bearer-token flow Docker Hub and ghcr use). The password is encrypted with
the server operator's key and never shown again: answers, logs, events and sandboxes never
hold it. At most {MAX_REGISTRY_CREDENTIALS_PER_TEAM} registries per team (409). 503 when the
server has no encryption key (its operator runs `pandastack setup`)."""


def _service(request: Request) -> RegistryCredentialService:
    service: RegistryCredentialService = request.app.state.registries
    return service


def to_credentials(row: RegistryCredential) -> RegistryCredentials:
    return RegistryCredentials(registry=row.registry_host, username=row.username,
                               created_at=row.created_at, updated_at=row.updated_at)


@router.put("/registry-credentials/{registry}", response_model=RegistryCredentials,
            operation_id="loginRegistry",
            summary="Store the team's credentials for a registry (its password is never "
                    "shown again)", description=PUT_DESCRIPTION)
async def login_registry(registry: RegistryName, body: RegistryLogin, who: CurrentPrincipal,
                         request: Request) -> RegistryCredentials:
    row = await _service(request).login(who.team, registry_param(registry), body)
    return to_credentials(row)


@router.get("/registry-credentials", response_model=RegistryCredentialsList,
            operation_id="listRegistryCredentials",
            summary="The registries the team has credentials for, with their usernames")
async def list_registry_credentials(who: CurrentPrincipal,
                                    request: Request) -> RegistryCredentialsList:
    rows = await _service(request).list(who.team)
    return RegistryCredentialsList(credentials=[to_credentials(r) for r in rows])


@router.delete("/registry-credentials/{registry}", status_code=204,
               operation_id="logoutRegistry",
               summary="Delete the team's credentials for a registry")
async def logout_registry(registry: RegistryName, who: CurrentPrincipal,
                          request: Request) -> Response:
    await _service(request).logout(who.team, registry_param(registry))
    return Response(status_code=204)
