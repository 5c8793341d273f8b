"""Routes of the snapshots this host holds."""

from __future__ import annotations

from fastapi import APIRouter, Response

from pandastack.hostport.wire import SnapshotInfoModel, SnapshotList

from .deps import Host

router = APIRouter(prefix="/snapshots", tags=["snapshots"])


@router.get("", operation_id="listSnapshots")
async def list_snapshots(host: Host, include_internal: bool = False) -> SnapshotList:
    infos = await host.list_snapshots(include_internal=include_internal)
    return SnapshotList(snapshots=[SnapshotInfoModel.of(i) for i in infos])


@router.get("/{snapshot_id}", operation_id="getSnapshot")
async def get_snapshot(snapshot_id: str, host: Host) -> SnapshotInfoModel:
    return SnapshotInfoModel.of(await host.snapshot_info(snapshot_id))


@router.delete("/{snapshot_id}", status_code=204, operation_id="deleteSnapshot")
async def delete_snapshot(snapshot_id: str, host: Host) -> Response:
    await host.delete_snapshot(snapshot_id)
    return Response(status_code=204)
