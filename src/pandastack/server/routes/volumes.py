"""Volumes (team-owned, by name): create, list, get, delete, resize. Attaching is part of a
sandbox's create (`CreateSandbox.volumes`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from pandastack.wire.resources import (
    CreateVolume,
    MoveVolume,
    ResizeVolume,
    VolumeInfo,
    VolumeList,
    VolumeSnapshotInfo,
    VolumeSnapshotList,
)

from ..accounts.auth import AdminPrincipal, CurrentPrincipal
from ..hosts.pinning import pinned_to
from ..volumes.snapshots import snapshot_info
from ..web.errors import ApiError
from ..web.jsonbody import StrictJsonRoute
from .deps import Service
from .links import links

router = APIRouter(tags=["volumes"], route_class=StrictJsonRoute)

VolumeName = Annotated[str, Path(max_length=64, description="the volume's name in its team")]


@router.post("/volumes", status_code=201, response_model=VolumeInfo,
             responses=links(201, ("getVolume", "deleteVolume", "resizeVolume", "moveVolume",
                                   "snapshotVolume"), {"name": "$response.body#/name"}),
             summary="Create a volume (ext4) that outlives every sandbox",
             description="Empty, or holding a volume snapshot (`from_snapshot`). Mount it "
                         "with `POST /v1/sandboxes {\"volumes\": [{\"name\": ..., "
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


SnapshotId = Annotated[str, Path(max_length=64, description="the volume snapshot's id")]


@router.post("/volumes/{name}/snapshots", status_code=201, response_model=VolumeSnapshotInfo,
             responses=links(201, ("getVolumeSnapshot", "deleteVolumeSnapshot"),
                             {"snapshot_id": "$response.body#/id"}),
             summary="Snapshot a volume into the object store",
             description="What the volume holds now, stored in the object store the hosts "
                         "share (holes and chunks stored before take nothing): it outlives "
                         "the volume, and `POST /v1/volumes {\"from_snapshot\": ...}` makes a "
                         "new volume of it on any host. 409 volume_in_use while a sandbox has "
                         "it mounted read-write (readers may stay); 409 where the hosts have "
                         "no object store.")
async def snapshot_volume(name: VolumeName, who: CurrentPrincipal,
                          service: Service) -> VolumeSnapshotInfo:
    return snapshot_info(await service.volumes.snapshots.take(who.team, name))


@router.get("/volume-snapshots", response_model=VolumeSnapshotList,
            summary="The team's volume snapshots (of one volume name, with `volume`)")
async def list_volume_snapshots(
        who: CurrentPrincipal, service: Service,
        volume: Annotated[str | None, Query(max_length=64)] = None) -> VolumeSnapshotList:
    rows = service.store.list_volume_backups(who.team, volume)
    return VolumeSnapshotList(snapshots=[snapshot_info(r) for r in rows])


@router.get("/volume-snapshots/{snapshot_id}", response_model=VolumeSnapshotInfo,
            summary="A volume snapshot")
async def get_volume_snapshot(snapshot_id: SnapshotId, who: CurrentPrincipal,
                              service: Service) -> VolumeSnapshotInfo:
    return snapshot_info(service.volumes.snapshots.row(who.team, snapshot_id))


@router.delete("/volume-snapshots/{snapshot_id}", status_code=204, response_class=Response,
               summary="Delete a volume snapshot",
               description="Volumes made of it are not touched.")
async def delete_volume_snapshot(snapshot_id: SnapshotId, who: CurrentPrincipal,
                                 service: Service) -> Response:
    await service.volumes.snapshots.delete(who.team, snapshot_id)
    return Response(status_code=204)


@router.post("/volumes/{name}/move", response_model=VolumeInfo,
             summary="Move a detached volume to another host (admin keys)",
             description="The volume keeps its id, name and data; sandboxes that mount it "
                         "afterwards land on its new host. Through the object store: 409 "
                         "volume_in_use while attached (hibernated sandboxes included), 422 "
                         "for an unknown host or a server that drives one host.")
async def move_volume(name: VolumeName, body: MoveVolume, who: AdminPrincipal,
                      service: Service) -> VolumeInfo:
    if service.cluster is None:
        raise ApiError(422, "validation_error", "host_id: this server drives one host "
                       "(there is no host to move the volume to)")
    row = await service.volumes.snapshots.move(body.team or who.team, name, body.host_id)
    return service.volumes.infos([row])[0]
