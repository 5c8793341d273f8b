"""The hosts of a cluster (admin only): list them, drain one (it takes no new sandbox and its
running ones move to other hosts), undrain it. A server that drives one host lists none and
answers 409 to a drain: there is nowhere to move to (server/hosts/drain.py)."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Path

from pandastack.wire.resources import DrainResult, HostInfo, HostList, HostState

from ..accounts.auth import AdminPrincipal
from ..hosts import drain as hosts
from ..web.jsonbody import StrictJsonRoute
from .deps import Service

router = APIRouter(tags=["hosts"], route_class=StrictJsonRoute)

HostId = Annotated[str, Path(max_length=64, description="host id, e.g. host-0123456789ab")]


def to_host_info(s: hosts.HostStatus) -> HostInfo:
    return HostInfo(
        id=s.id, endpoint=s.endpoint, state=cast(HostState, s.state), vcpus=s.vcpus,
        memory_mb=s.memory_mb, disk_mb=s.disk_mb, used_vcpus=s.used_vcpus,
        used_memory_mb=s.used_memory_mb, sandboxes=s.sandboxes, templates=list(s.templates),
        labels=dict(s.labels), version=s.version, epoch=s.epoch,
        heartbeat_age_seconds=s.heartbeat_age_seconds, protocol=s.protocol,
        incompatible_reason=s.incompatible_reason)


@router.get("/hosts", response_model=HostList,
            summary="Every registered host (none where the server drives one host)")
async def list_hosts(who: AdminPrincipal, service: Service) -> HostList:
    return HostList(hosts=[to_host_info(s) for s in await hosts.host_statuses(service)])


@router.get("/hosts/{host_id}", response_model=HostInfo, summary="One host")
async def get_host(host_id: HostId, who: AdminPrincipal, service: Service) -> HostInfo:
    return to_host_info(await hosts.host_status(service, host_id))


@router.post("/hosts/{host_id}/drain", response_model=DrainResult,
             summary="Take no new sandbox on the host, and move its running and paused ones "
                     "to other hosts (the same ids; hibernated ones stay)")
async def drain_host(host_id: HostId, who: AdminPrincipal, service: Service) -> DrainResult:
    report = await hosts.drain(service, host_id)
    return DrainResult(host_id=report.host_id, moved=report.moved, failed=report.failed,
                       stayed_hibernated=report.stayed_hibernated,
                       moved_live=report.moved_live)


@router.post("/hosts/{host_id}/undrain", response_model=HostInfo,
             summary="Let the host take new sandboxes again")
async def undrain_host(host_id: HostId, who: AdminPrincipal, service: Service) -> HostInfo:
    return to_host_info(await hosts.set_draining(service, host_id, False))
