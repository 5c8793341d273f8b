"""`HostClient`: a `pandastack agent` process as the host port's `RuntimePort`, over its
host API (spec/host-openapi.json). Raises the port's own errors, re-made from the agent's
envelopes; an agent that cannot be reached raises HostUnavailable."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pandastack.hostport.frames import Kind
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import BuildLog, SandboxPlacement
from pandastack.hostport.results import (
    BuildResult,
    MigrationDocument,
    SnapshotInfo,
    SnapshotResult,
    TransferDocument,
)
from pandastack.hostport.volumes import HostVolume, VolumeBackup, VolumeMountRequest
from pandastack.hostport.wire import (
    BackupVolumeRequest,
    BuildRequest,
    BuildResultModel,
    CreateRequest,
    CreateVolumeRequest,
    ForkRequest,
    HostStatus,
    HostVolumeList,
    HostVolumeModel,
    MigrationDocumentModel,
    Network,
    Placement,
    PrepareTemplateRequest,
    Pruned,
    PruneRequest,
    ResizeVolumeRequest,
    RestoreVolumeRequest,
    SandboxInfo,
    SandboxList,
    SnapshotInfoModel,
    SnapshotList,
    SnapshotRequest,
    SnapshotResultModel,
    TransferDocumentModel,
    VolumeBackupModel,
    VolumeMountModel,
    network_model,
)
from pandastack.templatespec import TemplateSpec

from .calls import Caller, api_path, parse
from .sandbox import RemoteSandbox
from .transport import Timeouts

# The agent keeps its token beside its socket unless told otherwise (cli/agent.py).
TOKEN_BESIDE_SOCKET = "agent.token"


def read_token(path: Path | None, agent: str | None = None) -> str:
    """The token in `path`; without one, the file beside the unix socket of `agent` where
    `pandastack agent` keeps it by default."""
    if path is None:
        if agent is None or not agent.startswith("unix:"):
            raise ValueError("the agent's token file is not set (PANDASTACK_AGENT_TOKEN_FILE: "
                             "the file the agent was given with --token-file)")
        path = Path(agent.removeprefix("unix:")).parent / TOKEN_BESIDE_SOCKET
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the agent's token file {path}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"the agent's token file {path} is empty")
    return token


class HostClient:
    """The agent at `url` (`unix:/path/to.sock` or `http://host:port`), authenticated by
    `token`. `start()` checks that it answers and takes the token; `close()` closes this
    client's connections only (the agent and its sandboxes go on)."""

    def __init__(self, url: str, token: str, *, timeouts: Timeouts | None = None) -> None:
        self._caller = Caller(url, token, timeouts or Timeouts())
        self.address = url

    @classmethod
    def from_token_file(cls, url: str, token_file: Path | None = None, *,
                        timeouts: Timeouts | None = None) -> HostClient:
        """See `read_token` for where the token is found without `token_file`."""
        return cls(url, read_token(token_file, url), timeouts=timeouts)

    def __repr__(self) -> str:
        return f"<HostClient {self.address}>"

    async def __aenter__(self) -> HostClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _t(self) -> Timeouts:
        return self._caller.timeouts

    def _sandbox(self, info: SandboxInfo) -> RemoteSandbox:
        return RemoteSandbox(self._caller, info)

    async def status(self) -> HostStatus:
        return await self._caller.model(HostStatus, "GET", api_path("host"), read=self._t.lookup)

    async def start(self) -> None:
        # The agent re-adopted its sandboxes when it started; this only makes sure it is
        # there and takes our token, so that a wrong setup fails at the control plane's start.
        await self.status()

    async def close(self) -> None:
        await self._caller.aclose()

    async def create(self, template: str = "base", *, vcpus: int = 1, memory_mb: int = 512,
                     disk_mb: int | None = None, sandbox_id: str | None = None,
                     snapshot: str | None = None,
                     network: NetworkPolicy | None = None,
                     volumes: Sequence[VolumeMountRequest] = ()) -> RemoteSandbox:
        body = CreateRequest(template=template, vcpus=vcpus, memory_mb=memory_mb,
                             disk_mb=disk_mb, sandbox_id=sandbox_id, snapshot=snapshot,
                             network=network_model(network),
                             volumes=[VolumeMountModel.of(v) for v in volumes])
        info = await self._caller.model(SandboxInfo, "POST", api_path("sandboxes"), json=body,
                                        read=self._t.lifecycle)
        return self._sandbox(info)

    async def prepare_template(self, name: str, *, vcpus: int = 1,
                               memory_mb: int = 512) -> None:
        await self._caller.call("POST", api_path("templates", name, "prepare"),
                                json=PrepareTemplateRequest(vcpus=vcpus, memory_mb=memory_mb),
                                read=None)

    async def get(self, sandbox_id: str) -> RemoteSandbox:
        info = await self._caller.model(SandboxInfo, "GET", api_path("sandboxes", sandbox_id),
                                        read=self._t.lookup)
        return self._sandbox(info)

    def handle(self, sandbox_id: str) -> RemoteSandbox:
        return self._sandbox(SandboxInfo(id=sandbox_id, state="running", alive=True))

    async def list_sandboxes(self) -> Sequence[RemoteSandbox]:
        listed = await self._caller.model(SandboxList, "GET", api_path("sandboxes"),
                                          read=self._t.lookup)
        return [self._sandbox(info) for info in listed.sandboxes]

    async def _lifecycle(self, sandbox_id: str, action: str) -> None:
        await self._caller.call("POST", api_path("sandboxes", sandbox_id, action),
                                read=self._t.lifecycle)

    async def kill(self, sandbox_id: str) -> None:
        await self._caller.call("DELETE", api_path("sandboxes", sandbox_id),
                                read=self._t.lifecycle)

    async def pause(self, sandbox_id: str) -> None:
        await self._lifecycle(sandbox_id, "pause")

    async def resume(self, sandbox_id: str) -> None:
        await self._lifecycle(sandbox_id, "resume")

    async def hibernate(self, sandbox_id: str) -> None:
        await self._lifecycle(sandbox_id, "hibernate")

    async def wake(self, sandbox_id: str) -> None:
        await self._lifecycle(sandbox_id, "wake")

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       internal: bool = False) -> SnapshotResult:
        result = await self._caller.model(
            SnapshotResultModel, "POST", api_path("sandboxes", sandbox_id, "snapshot"),
            json=SnapshotRequest(name=name, internal=internal), read=self._t.lifecycle)
        return result.value()

    async def fork(self, sandbox_id: str, count: int = 1) -> Sequence[RemoteSandbox]:
        listed = await self._caller.model(SandboxList, "POST",
                                          api_path("sandboxes", sandbox_id, "fork"),
                                          json=ForkRequest(count=count),
                                          read=self._t.lifecycle)
        return [self._sandbox(info) for info in listed.sandboxes]

    async def update_network(self, sandbox_id: str, network: NetworkPolicy) -> NetworkPolicy:
        applied = await self._caller.model(Network, "PUT",
                                           api_path("sandboxes", sandbox_id, "network"),
                                           json=Network.of(network), read=self._t.lifecycle)
        return applied.policy()

    async def _migration(self, sandbox_id: str, step: str,
                         document: MigrationDocument | None = None) -> MigrationDocument:
        body = None if document is None else MigrationDocumentModel(document=document)
        response = await self._caller.call("POST",
                                           api_path("sandboxes", sandbox_id, "migration", step),
                                           json=body, read=self._t.lifecycle)
        if response.status_code == 204:
            return {}
        return parse(MigrationDocumentModel, response.content, self.address).document

    async def offer_migration(self, sandbox_id: str) -> MigrationDocument:
        return await self._migration(sandbox_id, "offer")

    async def accept_migration(self, sandbox_id: str,
                               offer: MigrationDocument) -> MigrationDocument:
        return await self._migration(sandbox_id, "accept", offer)

    async def migrate(self, sandbox_id: str, ticket: MigrationDocument) -> MigrationDocument:
        return await self._migration(sandbox_id, "send", ticket)

    async def complete_migration(self, sandbox_id: str, handoff: MigrationDocument) -> None:
        await self._migration(sandbox_id, "complete", handoff)

    async def release_migrated(self, sandbox_id: str) -> None:
        await self._migration(sandbox_id, "release")

    async def abort_migration(self, sandbox_id: str) -> None:
        await self._migration(sandbox_id, "abort")

    async def offer_snapshot(self, sandbox_id: str) -> TransferDocument:
        response = await self._caller.call(
            "POST", api_path("sandboxes", sandbox_id, "snapshot-transfer", "offer"),
            read=self._t.lifecycle)
        return parse(TransferDocumentModel, response.content, self.address).document

    async def accept_snapshot(self, offer: TransferDocument) -> TransferDocument:
        response = await self._caller.call("POST", api_path("snapshot-transfers", "accept"),
                                           json=TransferDocumentModel(document=offer),
                                           read=self._t.lifecycle)
        return parse(TransferDocumentModel, response.content, self.address).document

    async def send_snapshot(self, snapshot_id: str, ticket: TransferDocument) -> None:
        await self._caller.call("POST", api_path("snapshots", snapshot_id, "transfer"),
                                json=TransferDocumentModel(document=ticket),
                                read=self._t.lifecycle)

    async def placement(self, sandbox_id: str) -> SandboxPlacement:
        placement = await self._caller.model(Placement, "GET",
                                             api_path("sandboxes", sandbox_id, "placement"),
                                             read=self._t.lookup)
        return placement.value()

    async def console_log(self, sandbox_id: str, max_bytes: int) -> bytes:
        response = await self._caller.call("GET", api_path("sandboxes", sandbox_id, "console"),
                                           params={"max_bytes": max_bytes},
                                           read=self._t.lookup)
        return response.content

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        info = await self._caller.model(SnapshotInfoModel, "GET",
                                        api_path("snapshots", snapshot_id), read=self._t.lookup)
        return info.value()

    async def list_snapshots(self, *, include_internal: bool = False) -> list[SnapshotInfo]:
        listed = await self._caller.model(SnapshotList, "GET", api_path("snapshots"),
                                          params={"include_internal": include_internal},
                                          read=self._t.lookup)
        return [info.value() for info in listed.snapshots]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._caller.call("DELETE", api_path("snapshots", snapshot_id),
                                read=self._t.lifecycle)

    # -- volumes (VolumePort) ---------------------------------------------------------------

    async def create_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        body = CreateVolumeRequest(volume_id=volume_id, size_mb=size_mb)
        made = await self._caller.model(HostVolumeModel, "POST", api_path("volumes"),
                                        json=body, read=self._t.lifecycle)
        return made.value()

    async def get_volume(self, volume_id: str) -> HostVolume:
        found = await self._caller.model(HostVolumeModel, "GET",
                                         api_path("volumes", volume_id), read=self._t.lookup)
        return found.value()

    async def list_volumes(self) -> Sequence[HostVolume]:
        listed = await self._caller.model(HostVolumeList, "GET", api_path("volumes"),
                                          read=self._t.lookup)
        return [v.value() for v in listed.volumes]

    async def resize_volume(self, volume_id: str, size_mb: int) -> HostVolume:
        grown = await self._caller.model(HostVolumeModel, "POST",
                                         api_path("volumes", volume_id, "resize"),
                                         json=ResizeVolumeRequest(size_mb=size_mb),
                                         read=self._t.lifecycle)
        return grown.value()

    async def delete_volume(self, volume_id: str) -> None:
        await self._caller.call("DELETE", api_path("volumes", volume_id),
                                read=self._t.lifecycle)

    async def backup_volume(self, volume_id: str, backup_id: str) -> VolumeBackup:
        # An upload of the whole image: no read deadline, like a publish.
        made = await self._caller.model(VolumeBackupModel, "POST",
                                        api_path("volumes", volume_id, "backup"),
                                        json=BackupVolumeRequest(backup_id=backup_id),
                                        read=None)
        return made.value()

    async def restore_volume(self, backup_id: str, volume_id: str) -> HostVolume:
        made = await self._caller.model(HostVolumeModel, "POST",
                                        api_path("volume-backups", "restore"),
                                        json=RestoreVolumeRequest(backup_id=backup_id,
                                                                  volume_id=volume_id),
                                        read=None)
        return made.value()

    async def delete_volume_backup(self, backup_id: str) -> None:
        await self._caller.call("DELETE", api_path("volume-backups", backup_id),
                                read=self._t.lifecycle)

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None, vcpus: int = 1,
                             memory_mb: int = 512, cache_scope: str = "") -> BuildResult:
        body = BuildRequest(spec=spec, network=network_model(network), vcpus=vcpus,
                            memory_mb=memory_mb, cache_scope=cache_scope)
        async with self._caller.stream("POST", api_path("templates", "builds"), json=body,
                                       read=None) as frames:
            async for frame in frames:
                if frame.kind is Kind.LOG:
                    log(frame.payload.decode("utf-8", "replace"))
        return parse(BuildResultModel, frames.result, self.address).value()

    async def prune_build_cache(self, keep_newest: int) -> list[str]:
        pruned = await self._caller.model(Pruned, "POST", api_path("templates", "build-cache",
                                                               "prune"),
                                          json=PruneRequest(keep_newest=keep_newest),
                                          read=self._t.lifecycle)
        return pruned.deleted
