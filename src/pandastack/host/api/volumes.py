"""Routes of the volumes this host keeps (ADR 0027)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from pandastack.hostport.errors import VolumeNotFound
from pandastack.hostport.volumes import VolumePort
from pandastack.hostport.wire import (
    BackupVolumeRequest,
    CreateVolumeRequest,
    HostVolumeList,
    HostVolumeModel,
    ResizeVolumeRequest,
    RestoreVolumeRequest,
    VolumeBackupModel,
)

router = APIRouter(prefix="/volumes", tags=["volumes"])
backups = APIRouter(prefix="/volume-backups", tags=["volumes"])


def get_volumes(request: Request) -> VolumePort:
    host = request.app.state.host
    if not isinstance(host, VolumePort):
        raise VolumeNotFound("this host keeps no volumes")
    return host


Volumes = Annotated[VolumePort, Depends(get_volumes)]


@router.post("", status_code=201, operation_id="createVolume")
async def create_volume(body: CreateVolumeRequest, host: Volumes) -> HostVolumeModel:
    return HostVolumeModel.of(await host.create_volume(body.volume_id, body.size_mb))


@router.get("", operation_id="listVolumes")
async def list_volumes(host: Volumes) -> HostVolumeList:
    return HostVolumeList(volumes=[HostVolumeModel.of(v) for v in await host.list_volumes()])


@router.get("/{volume_id}", operation_id="getVolume")
async def get_volume(volume_id: str, host: Volumes) -> HostVolumeModel:
    return HostVolumeModel.of(await host.get_volume(volume_id))


@router.post("/{volume_id}/resize", operation_id="resizeVolume")
async def resize_volume(volume_id: str, body: ResizeVolumeRequest,
                        host: Volumes) -> HostVolumeModel:
    return HostVolumeModel.of(await host.resize_volume(volume_id, body.size_mb))


@router.delete("/{volume_id}", status_code=204, operation_id="deleteVolume")
async def delete_volume(volume_id: str, host: Volumes) -> Response:
    await host.delete_volume(volume_id)
    return Response(status_code=204)


@router.post("/{volume_id}/backup", status_code=201, operation_id="backupVolume")
async def backup_volume(volume_id: str, body: BackupVolumeRequest,
                        host: Volumes) -> VolumeBackupModel:
    return VolumeBackupModel.of(await host.backup_volume(volume_id, body.backup_id))


@backups.post("/restore", status_code=201, operation_id="restoreVolumeBackup")
async def restore_volume(body: RestoreVolumeRequest, host: Volumes) -> HostVolumeModel:
    return HostVolumeModel.of(await host.restore_volume(body.backup_id, body.volume_id))


@backups.delete("/{backup_id}", status_code=204, operation_id="deleteVolumeBackup")
async def delete_volume_backup(backup_id: str, host: Volumes) -> Response:
    await host.delete_volume_backup(backup_id)
    return Response(status_code=204)
