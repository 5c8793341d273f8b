"""Routes of live migration (ADR 0023): each is one step the control plane drives on the
source or the destination. The memory itself never passes here: it goes from the source's
VMM to a one-shot listener of the destination's agent."""

from __future__ import annotations

from fastapi import APIRouter, Response

from pandastack.hostport.errors import SetupError
from pandastack.hostport.protocols import MigrationPort, RuntimePort
from pandastack.hostport.wire import MigrationDocumentModel

from .deps import Host

router = APIRouter(prefix="/sandboxes/{sandbox_id}/migration", tags=["migration"])


def _port(host: RuntimePort) -> MigrationPort:
    if not isinstance(host, MigrationPort):
        raise SetupError("this host does not migrate sandboxes")
    return host


@router.post("/offer", operation_id="offerMigration")
async def offer_migration(sandbox_id: str, host: Host) -> MigrationDocumentModel:
    return MigrationDocumentModel(document=await _port(host).offer_migration(sandbox_id))


@router.post("/accept", operation_id="acceptMigration")
async def accept_migration(sandbox_id: str, body: MigrationDocumentModel,
                           host: Host) -> MigrationDocumentModel:
    return MigrationDocumentModel(
        document=await _port(host).accept_migration(sandbox_id, body.document))


@router.post("/send", operation_id="migrateSandbox")
async def migrate_sandbox(sandbox_id: str, body: MigrationDocumentModel,
                          host: Host) -> MigrationDocumentModel:
    return MigrationDocumentModel(document=await _port(host).migrate(sandbox_id, body.document))


@router.post("/complete", status_code=204, operation_id="completeMigration")
async def complete_migration(sandbox_id: str, body: MigrationDocumentModel,
                             host: Host) -> Response:
    await _port(host).complete_migration(sandbox_id, body.document)
    return Response(status_code=204)


@router.post("/release", status_code=204, operation_id="releaseMigrated")
async def release_migrated(sandbox_id: str, host: Host) -> Response:
    await _port(host).release_migrated(sandbox_id)
    return Response(status_code=204)


@router.post("/abort", status_code=204, operation_id="abortMigration")
async def abort_migration(sandbox_id: str, host: Host) -> Response:
    await _port(host).abort_migration(sandbox_id)
    return Response(status_code=204)
