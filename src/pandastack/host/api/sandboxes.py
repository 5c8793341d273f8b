"""Routes of the sandboxes' lifecycle on this host: create, find, list, kill, pause, resume,
snapshot, fork, hibernate, wake, the egress policy, where the network is, the console."""

from __future__ import annotations

from fastapi import APIRouter, Query, Response

from pandastack.hostport.wire import (
    CreateRequest,
    ForkRequest,
    Network,
    Placement,
    SandboxInfo,
    SandboxList,
    SnapshotRequest,
    SnapshotResultModel,
    network_of,
)

from .deps import Host

router = APIRouter(prefix="/sandboxes", tags=["sandboxes"])
ID = "/{sandbox_id}"
MAX_CONSOLE_BYTES = 16 * 2**20


@router.post("", status_code=201, operation_id="createSandbox")
async def create_sandbox(body: CreateRequest, host: Host) -> SandboxInfo:
    sandbox = await host.create(body.template, vcpus=body.vcpus, memory_mb=body.memory_mb,
                                disk_mb=body.disk_mb, sandbox_id=body.sandbox_id,
                                snapshot=body.snapshot, network=network_of(body.network),
                                volumes=[v.value() for v in body.volumes])
    return SandboxInfo.of(sandbox)


@router.get("", operation_id="listSandboxes")
async def list_sandboxes(host: Host) -> SandboxList:
    return SandboxList(sandboxes=[SandboxInfo.of(s) for s in await host.list_sandboxes()])


@router.get(ID, operation_id="getSandbox")
async def get_sandbox(sandbox_id: str, host: Host) -> SandboxInfo:
    return SandboxInfo.of(await host.get(sandbox_id))


@router.delete(ID, status_code=204, operation_id="killSandbox")
async def kill_sandbox(sandbox_id: str, host: Host) -> Response:
    await host.kill(sandbox_id)
    return Response(status_code=204)


@router.post(ID + "/pause", status_code=204, operation_id="pauseSandbox")
async def pause_sandbox(sandbox_id: str, host: Host) -> Response:
    await host.pause(sandbox_id)
    return Response(status_code=204)


@router.post(ID + "/resume", status_code=204, operation_id="resumeSandbox")
async def resume_sandbox(sandbox_id: str, host: Host) -> Response:
    await host.resume(sandbox_id)
    return Response(status_code=204)


@router.post(ID + "/hibernate", status_code=204, operation_id="hibernateSandbox")
async def hibernate_sandbox(sandbox_id: str, host: Host) -> Response:
    await host.hibernate(sandbox_id)
    return Response(status_code=204)


@router.post(ID + "/wake", status_code=204, operation_id="wakeSandbox")
async def wake_sandbox(sandbox_id: str, host: Host) -> Response:
    await host.wake(sandbox_id)
    return Response(status_code=204)


@router.post(ID + "/snapshot", status_code=201, operation_id="snapshotSandbox")
async def snapshot_sandbox(sandbox_id: str, body: SnapshotRequest,
                           host: Host) -> SnapshotResultModel:
    return SnapshotResultModel.of(
        await host.snapshot(sandbox_id, body.name, internal=body.internal))


@router.post(ID + "/fork", status_code=201, operation_id="forkSandbox")
async def fork_sandbox(sandbox_id: str, body: ForkRequest, host: Host) -> SandboxList:
    forks = await host.fork(sandbox_id, body.count)
    return SandboxList(sandboxes=[SandboxInfo.of(s) for s in forks])


@router.put(ID + "/network", operation_id="updateNetwork")
async def update_network(sandbox_id: str, body: Network, host: Host) -> Network:
    return Network.of(await host.update_network(sandbox_id, body.policy()))


@router.get(ID + "/placement", operation_id="getPlacement")
async def get_placement(sandbox_id: str, host: Host) -> Placement:
    return Placement.of(await host.placement(sandbox_id))


@router.get(ID + "/console", operation_id="getConsoleLog",
            response_class=Response,
            responses={200: {"content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}},
                "description": "the last max_bytes of the guest's console"}})
async def get_console_log(sandbox_id: str, host: Host,
                          max_bytes: int = Query(65536, ge=0, le=MAX_CONSOLE_BYTES)) -> Response:
    data = await host.console_log(sandbox_id, max_bytes)
    return Response(data, media_type="application/octet-stream")
