"""Pause and resume (vCPUs stopped in place), hibernate and wake (state on disk, no VM)."""

from __future__ import annotations

from fastapi import APIRouter

from pandastack.wire.sandboxes import SandboxInfo

from ..accounts.auth import CurrentPrincipal
from ..web.jsonbody import StrictJsonRoute
from .deps import SandboxId, Service

router = APIRouter(tags=["state"], route_class=StrictJsonRoute)


@router.post("/sandboxes/{sandbox_id}/pause", response_model=SandboxInfo,
             summary="Stop the sandbox's vCPUs in place (state `paused`)",
             description="Guest operations (exec, files, processes) on a paused sandbox get "
                         "409 until it is resumed. Idempotent; a hibernated sandbox is woken "
                         "first.")
async def pause_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                        service: Service) -> SandboxInfo:
    return service.info(await service.pause(who.team, sandbox_id))


@router.post("/sandboxes/{sandbox_id}/resume", response_model=SandboxInfo,
             summary="Restart the vCPUs of a paused sandbox (state `running`)",
             description="Idempotent; a hibernated sandbox is woken.")
async def resume_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                         service: Service) -> SandboxInfo:
    return service.info(await service.resume(who.team, sandbox_id))


@router.post("/sandboxes/{sandbox_id}/hibernate", response_model=SandboxInfo,
             summary="Write the whole state to disk and end the VM (state `hibernated`)",
             description="Frees the sandbox's RAM and CPU. Any guest operation (exec, files, "
                         "processes), a snapshot, a fork, or `wake` brings it back with its "
                         "processes and files. Idempotent.")
async def hibernate_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                            service: Service) -> SandboxInfo:
    return service.info(await service.hibernate(who.team, sandbox_id))


@router.post("/sandboxes/{sandbox_id}/wake", response_model=SandboxInfo,
             summary="Restore a hibernated sandbox (a no-op for one that is awake)")
async def wake_sandbox(sandbox_id: SandboxId, who: CurrentPrincipal,
                       service: Service) -> SandboxInfo:
    return service.info(await service.wake(who.team, sandbox_id))
