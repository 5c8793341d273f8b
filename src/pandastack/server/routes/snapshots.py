"""Snapshots (team-owned: take, list, get, delete) and fork."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from pandastack.wire.sandboxes import (
    CreateSnapshot,
    ForkRequest,
    ForkResult,
    SnapshotInfo,
    SnapshotList,
)

from ..accounts.auth import CurrentPrincipal
from ..hosts.pinning import pinned_to
from ..sandboxes.snapshots import (
    delete_snapshot,
    fork,
    snapshot_row,
    take_snapshot,
    to_snapshot_info,
)
from ..web.jsonbody import StrictJsonRoute
from .deps import SandboxId, Service
from .links import links, sandbox_links

router = APIRouter(tags=["snapshots"], route_class=StrictJsonRoute)

SnapshotId = Annotated[str, Path(max_length=64, description="snapshot id, e.g. "
                                                            "snap-0123456789ab")]


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, response_model=SnapshotInfo,
             responses=links(201, ("getSnapshot", "deleteSnapshot"),
                             {"snapshot_id": "$response.body#/id"}),
             summary="Snapshot memory, processes and disk; the sandbox keeps running",
             description="The sandbox pauses only briefly: for the final copy of its memory "
                         "under KVM or QEMU >= 9 (pre-copy); under older QEMU with TCG, while "
                         "its device state is captured and its memory write-protected, which "
                         "is then saved as the guest runs (ADR 0008; where the memory cannot "
                         "be write-protected, for the whole save). Create sandboxes from it "
                         "with `POST /v1/sandboxes {\"snapshot\": id}`, any number of times. "
                         "409 if the sandbox ended or is not on this host; 507 if the host "
                         "ran out of disk space (the sandbox keeps running).")
async def create_snapshot(sandbox_id: SandboxId, body: CreateSnapshot, who: CurrentPrincipal,
                          service: Service) -> SnapshotInfo:
    return to_snapshot_info(await take_snapshot(service, who.team, sandbox_id, body.name))


@router.get("/snapshots", response_model=SnapshotList, summary="The team's snapshots")
async def list_snapshots(who: CurrentPrincipal, service: Service) -> SnapshotList:
    return SnapshotList(snapshots=[to_snapshot_info(r)
                                   for r in service.store.list_snapshots(who.team)])


@router.get("/snapshots/{snapshot_id}", response_model=SnapshotInfo)
async def get_snapshot(snapshot_id: SnapshotId, who: CurrentPrincipal,
                       service: Service) -> SnapshotInfo:
    return to_snapshot_info(snapshot_row(service, who.team, snapshot_id))


@router.delete("/snapshots/{snapshot_id}",
               operation_id="deleteSnapshot", status_code=204, response_class=Response,
               summary="Delete a snapshot (sandboxes created from it keep running)")
async def remove_snapshot(snapshot_id: SnapshotId, who: CurrentPrincipal,
                          service: Service) -> Response:
    await delete_snapshot(service, who.team, snapshot_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201, response_model=ForkResult,
             responses=sandbox_links(201, "$response.body#/sandboxes/0/id"),
             summary="Fork a live sandbox into `count` children (1 to 16)",
             description="Each child starts with the parent's memory, running processes and "
                         "files as they were at the fork instant (copy-on-write), with its own "
                         "id, hostname and machine-id; the parent keeps running. Children are "
                         "new sandboxes of the same team with the parent's ttl, persistence, "
                         "env and metadata. 409 if the parent ended.")
async def fork_sandbox(sandbox_id: SandboxId, body: ForkRequest, who: CurrentPrincipal,
                       service: Service) -> ForkResult:
    with pinned_to(body.host_id, admin=who.admin):
        forked = await fork(service, who.team, sandbox_id, body.count, durable=body.durable)
    return ForkResult(parent=forked.parent.id, sandboxes=service.infos(forked.children),
                      duration_ms=forked.duration_ms, parent_pause_ms=forked.parent_pause_ms)
