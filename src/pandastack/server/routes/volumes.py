"""Volumes (team-owned, by name): create, list, get, delete, resize. Attaching is part of a
sandbox's create (`CreateSandbox.volumes`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from pandastack.wire import CreateVolume, ResizeVolume, VolumeInfo, VolumeList

from ..auth import CurrentPrincipal
from ..errors import ApiError
from ..hosts.pinning import pinned_to
from ..jsonbody import StrictJsonRoute
from .deps import Service

router = APIRouter(tags=["volumes"], route_class=StrictJsonRoute)

VolumeName = Annotated[str, Path(max_length=64, description="the volume's name in its team")]


@router.post("/volumes", status_code=201, response_model=VolumeInfo,
             summary="Create an empty volume (ext4) that outlives every sandbox",
             description="Mount it with `POST /v1/sandboxes {\"volumes\": [{\"name\": ..., "
                         "\"mount_path\": ...}]}`: one sandbox may mount it read-write at a "
                         "time, any number read-only. 409 if the team has a volume of that "
                         "name; 429 past the team's volume quota. `host_id`: admin keys "
                         "only, where the server drives many hosts.")
async def create_volume(body: CreateVolume, who: CurrentPrincipal,
                        service: Service) -> VolumeInfo:
    if body.host_id is not None and service.cluster is None and who.admin:
        raise ApiError(422, "validation_error", "host_id: this server drives one host "
                       "(there is no host to choose)")
    with pinned_to(body.host_id, admin=who.admin):
        row = await service.volumes.create(who.team, body)
    return service.volumes.infos([row])[0]


@router.get("/volumes", response_model=VolumeList, summary="The team's volumes")
async def list_volumes(who: CurrentPrincipal, service: Service) -> VolumeList:
    return VolumeList(volumes=service.volumes.infos(service.store.list_volumes(who.team)))


@router.get("/volumes/{name}", response_model=VolumeInfo,
            summary="A volume, with the sandboxes that have it attached")
async def get_volume(name: VolumeName, who: CurrentPrincipal, service: Service) -> VolumeInfo:
    return service.volumes.infos([service.volumes.row(who.team, name)])[0]


@router.delete("/volumes/{name}", status_code=204, response_class=Response,
               summary="Delete a volume and its data",
               description="409 volume_in_use while a sandbox that has not ended (a "
                           "hibernated one included) has it attached.")
async def delete_volume(name: VolumeName, who: CurrentPrincipal, service: Service) -> Response:
    await service.volumes.delete(who.team, name)
    return Response(status_code=204)


@router.post("/volumes/{name}/resize", response_model=VolumeInfo,
             summary="Grow a detached volume (its file system follows)",
             description="409 volume_in_use while attached; 422 to shrink it; 429 past the "
                         "team's volume quota.")
async def resize_volume(name: VolumeName, body: ResizeVolume, who: CurrentPrincipal,
                        service: Service) -> VolumeInfo:
    row = await service.volumes.resize(who.team, name, body.size_mb)
    return service.volumes.infos([row])[0]
