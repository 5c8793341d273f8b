"""Routes of snapshot transfers (ADR 0024): the steps of a fork onto another host whose
state goes from agent to agent. The files themselves never pass here: they go from the
source agent to a one-shot listener of the destination's."""

from __future__ import annotations

from fastapi import APIRouter, Response

from pandastack.hostport.errors import SetupError
from pandastack.hostport.protocols import RuntimePort, SnapshotTransferPort
from pandastack.hostport.wire import TransferDocumentModel

from .deps import Host

router = APIRouter(tags=["snapshot transfer"])


def _port(host: RuntimePort) -> SnapshotTransferPort:
    if not isinstance(host, SnapshotTransferPort):
        raise SetupError("this host does not transfer snapshots")
    return host


@router.post("/sandboxes/{sandbox_id}/snapshot-transfer/offer",
             operation_id="offerSnapshotTransfer")
async def offer_snapshot_transfer(sandbox_id: str, host: Host) -> TransferDocumentModel:
    return TransferDocumentModel(document=await _port(host).offer_snapshot(sandbox_id))


@router.post("/snapshot-transfers/accept", operation_id="acceptSnapshotTransfer")
async def accept_snapshot_transfer(body: TransferDocumentModel,
                                   host: Host) -> TransferDocumentModel:
    return TransferDocumentModel(document=await _port(host).accept_snapshot(body.document))


@router.post("/snapshots/{snapshot_id}/transfer", status_code=204,
             operation_id="sendSnapshotTransfer")
async def send_snapshot_transfer(snapshot_id: str, body: TransferDocumentModel,
                                 host: Host) -> Response:
    await _port(host).send_snapshot(snapshot_id, body.document)
    return Response(status_code=204)
