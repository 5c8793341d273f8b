"""`Client` / `AsyncClient`: one connection pool for many sandboxes, plus key management.

    from pandastack import Client

    with Client() as client:
        for old in client.sandboxes.list(metadata={"job": "nightly"}):  # live ones
            print(old.id, old.info.template)
            old.kill()
        sbx = client.sandboxes.create(template="base", ttl_seconds=600)

Sandboxes made through a client share its connections; closing the client closes them.
"""

from __future__ import annotations

import builtins
import datetime
import os
from collections.abc import Mapping, Sequence
from types import TracebackType

import httpx

from pandastack.rules import DEFAULT_TEMPLATE
from pandastack.sdk import _admin, _base, _names, _streams
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk._streams import SandboxPage
from pandastack.sdk._usage import AsyncTeams, Teams, TimeArg, usage_call
from pandastack.sdk.async_sandbox import AsyncSandbox
from pandastack.sdk.async_sandbox import create_waiting as acreate_waiting
from pandastack.sdk.config import DEFAULT_TIMEOUT, TimeoutTypes, resolve_config
from pandastack.sdk.events import AsyncEvents, AsyncWebhooks, Events, Webhooks
from pandastack.sdk.models import (
    CreatedKey,
    DrainResult,
    HostInfo,
    KeyInfo,
    SandboxInfo,
    SnapshotInfo,
)
from pandastack.sdk.registries import AsyncRegistries, Registries
from pandastack.sdk.sandbox import Sandbox, create_waiting
from pandastack.sdk.templates import AsyncTemplates, Templates
from pandastack.sdk.volumes import AsyncVolumes, Volumes
from pandastack.wire.usage import UsageGroupBy, UsageReport

__all__ = ["AsyncClient", "AsyncHosts", "AsyncKeys", "AsyncSandboxes", "AsyncSnapshots",
           "AsyncTeams", "AsyncVolumes", "Client", "Hosts", "Keys", "Sandboxes", "Snapshots",
           "Teams", "Volumes"]


class Sandboxes(_base.ClientBase[HTTP]):
    """`client.sandboxes`: list, inspect, create and kill sandboxes."""

    def list(self, state: str | None = None, metadata: Mapping[str, str] | None = None, *,
             include_ended: bool = False, template: str | None = None,
             started_after: float | datetime.datetime | None = None, limit: int | None = None,
             next_token: str | None = None) -> SandboxPage[Sandbox]:
        """The sandboxes of this key's team, oldest first: the live ones, or every one with
        `include_ended=True`, or those in `state` (ended or not); only those carrying every
        `metadata` label given, of `template`, created after `started_after`. With `limit`,
        one page: pass its `next_token` back (same filters) for the next. Each item is a
        handle on this client's connections."""
        infos, token = self._http.run(_streams.list_page_call(
            state, metadata, include_ended, template=template, started_after=started_after,
            limit=limit, next_token=next_token))
        return SandboxPage([Sandbox(info, self._http) for info in infos], token)

    def get(self, sandbox_id: str) -> SandboxInfo:
        """The current state of sandbox `sandbox_id`."""
        return self._http.run(_base.get_sandbox_call(sandbox_id))

    def create(self, template: str = DEFAULT_TEMPLATE, ttl_seconds: int | None = None,
               persistent: bool = False, vcpus: int | None = None,
               memory_mb: int | None = None, env: Mapping[str, str] | None = None,
               metadata: Mapping[str, str] | None = None, *,
               disk_mb: int | None = None, snapshot: str | None = None,
               network: _base.NetworkArg | None = None,
               volumes: Sequence[_base.VolumeArg] | None = None,
               name: str | None = None, host_id: str | None = None) -> Sandbox:
        """Create a sandbox (arguments as `Sandbox.create`); it uses this client's connections."""
        return Sandbox(create_waiting(self._http, _base.create_sandbox_call(
            template=template, ttl_seconds=ttl_seconds, persistent=persistent, vcpus=vcpus,
            memory_mb=memory_mb, disk_mb=disk_mb, env=env, metadata=metadata,
            snapshot=snapshot, network=network, volumes=volumes, name=name,
            host_id=host_id)), self._http)

    def get_or_create(self, name: str, template: str = DEFAULT_TEMPLATE,
                      ttl_seconds: int | None = None, persistent: bool = False,
                      vcpus: int | None = None, memory_mb: int | None = None,
                      env: Mapping[str, str] | None = None,
                      metadata: Mapping[str, str] | None = None, *, disk_mb: int | None = None,
                      snapshot: str | None = None, network: _base.NetworkArg | None = None,
                      volumes: Sequence[_base.VolumeArg] | None = None,
                      host_id: str | None = None) -> Sandbox:
        """The team's live sandbox named `name`, or a new one (as `Sandbox.get_or_create`);
        it uses this client's connections."""
        create = _base.create_sandbox_call(
            template=template, ttl_seconds=ttl_seconds, persistent=persistent, vcpus=vcpus,
            memory_mb=memory_mb, disk_mb=disk_mb, env=env, metadata=metadata,
            snapshot=snapshot, network=network, volumes=volumes, name=name,
            host_id=host_id)
        return Sandbox(create_waiting(self._http, _names.get_or_create_call(create, name)),
                       self._http)

    def connect(self, sandbox_id: str) -> Sandbox:
        """A handle on the existing sandbox `sandbox_id` (or the live one of that name),
        using this client's connections."""
        return Sandbox(self.get(sandbox_id), self._http)

    def kill(self, sandbox_id: str) -> None:
        """Kill sandbox `sandbox_id` (`NotFoundError` if there is none)."""
        self._http.run(_base.kill_sandbox_call(sandbox_id))


class Keys(_base.ClientBase[HTTP]):
    """`client.keys`: API keys (needs a key allowed to manage keys)."""

    def create(self, name: str, team: str | None = None) -> CreatedKey:
        """Create a key; the secret is in `.key` and is shown only this once."""
        return self._http.run(_admin.create_key_call(name, team))

    def list(self) -> builtins.list[KeyInfo]:
        """The keys of this team (without secrets)."""
        return self._http.run(_admin.list_keys_call())

    def revoke(self, key_id: str) -> None:
        """Revoke key `key_id`; requests made with it fail from now on."""
        self._http.run(_admin.revoke_key_call(key_id))


class Snapshots(_base.ClientBase[HTTP]):
    """`client.snapshots`: the team's snapshots (make them with `Sandbox.snapshot()`)."""

    def list(self) -> builtins.list[SnapshotInfo]:
        """The snapshots of this key's team, oldest first."""
        return self._http.run(_base.list_snapshots_call())

    def get(self, snapshot_id: str) -> SnapshotInfo:
        """Snapshot `snapshot_id` (`NotFoundError` if there is none in this team)."""
        return self._http.run(_base.get_snapshot_call(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """Delete snapshot `snapshot_id`; sandboxes created from it keep running."""
        self._http.run(_base.delete_snapshot_call(snapshot_id))


class Hosts(_base.ClientBase[HTTP]):
    """`client.hosts`: the hosts of a cluster (needs an admin key; a server that drives one
    host lists none and refuses a drain with `ConflictError`)."""

    def list(self) -> builtins.list[HostInfo]:
        """Every registered host: live, draining, stale or lost."""
        return self._http.run(_admin.list_hosts_call())

    def get(self, host_id: str) -> HostInfo:
        """Host `host_id` (`NotFoundError` if none is registered)."""
        return self._http.run(_admin.get_host_call(host_id))

    def drain(self, host_id: str) -> DrainResult:
        """Let host `host_id` take no new sandbox and move its running and paused ones to
        other hosts (same ids); returns when every move is done or failed. Draining again
        retries the ones that failed."""
        return self._http.run(_admin.drain_host_call(host_id, base_timeout=self._http.timeout))

    def undrain(self, host_id: str) -> HostInfo:
        """Let host `host_id` take new sandboxes again (the moved ones stay where they are)."""
        return self._http.run(_admin.undrain_host_call(host_id))


class Client(_base.ClientBase[HTTP]):
    """A pandastack API client. `api_url`/`api_key` override the environment and config file
    (see `pandastack.sdk.config`); `timeout` is the HTTP timeout of ordinary requests;
    `ca_bundle` is the PEM file of the CA that issued an https:// server's certificate
    (PANDASTACK_CA_BUNDLE; default: the system's CAs); `transport` replaces httpx's transport
    (e.g. `httpx.MockTransport` in tests)."""

    def __init__(self, api_url: str | None = None, api_key: str | None = None, *,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                 transport: httpx.BaseTransport | None = None,
                 ca_bundle: str | os.PathLike[str] | None = None) -> None:
        config = resolve_config(api_url, api_key, timeout=timeout, ca_bundle=ca_bundle)
        super().__init__(config, HTTP(config, transport))
        self._sandboxes = Sandboxes(config, self._http)
        self._keys = Keys(config, self._http)
        self._snapshots = Snapshots(config, self._http)
        self._templates = Templates(config, self._http)
        self._hosts = Hosts(config, self._http)
        self._teams = Teams(config, self._http)
        self._volumes = Volumes(config, self._http)
        self._events = Events(config, self._http)
        self._webhooks = Webhooks(config, self._http)
        self._registries = Registries(config, self._http)

    @property
    def sandboxes(self) -> Sandboxes:
        """List, inspect, create and kill sandboxes."""
        return self._sandboxes

    @property
    def keys(self) -> Keys:
        """Manage API keys."""
        return self._keys

    @property
    def snapshots(self) -> Snapshots:
        """List, inspect and delete the team's snapshots."""
        return self._snapshots

    @property
    def templates(self) -> Templates:
        """Build the team's templates; list, inspect and delete their versions."""
        return self._templates

    @property
    def hosts(self) -> Hosts:
        """List a cluster's hosts; drain and undrain them (admin keys)."""
        return self._hosts

    @property
    def teams(self) -> Teams:
        """Set and read teams' quotas (admin keys)."""
        return self._teams

    @property
    def volumes(self) -> Volumes:
        """Create, list, inspect, grow and delete the team's volumes."""
        return self._volumes

    @property
    def events(self) -> Events:
        """The team's event log, live (`events.stream()`)."""
        return self._events

    @property
    def webhooks(self) -> Webhooks:
        """Create, list, test and delete the team's webhooks; their delivery logs."""
        return self._webhooks

    @property
    def registries(self) -> Registries:
        """The team's credentials for image registries (template builds pull with them)."""
        return self._registries

    def usage(self, start: TimeArg | None = None, end: TimeArg | None = None,
              group_by: UsageGroupBy = "sandbox", *, team: str | None = None) -> UsageReport:
        """What this key's team held in [start, end) and what it cost, per sandbox, day or
        template (default: this month so far). An admin key sees every team, or `team`."""
        return self._http.run(usage_call(start, end, group_by, team))

    def close(self) -> None:
        """Close the connection pool (sandbox handles made by this client stop working)."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncSandboxes(_base.ClientBase[AsyncHTTP]):
    """`client.sandboxes`: list, inspect, create and kill sandboxes (async)."""

    async def list(self, state: str | None = None, metadata: Mapping[str, str] | None = None,
                   *, include_ended: bool = False, template: str | None = None,
                   started_after: float | datetime.datetime | None = None,
                   limit: int | None = None,
                   next_token: str | None = None) -> SandboxPage[AsyncSandbox]:
        """The sandboxes of this key's team, oldest first: the live ones, or every one with
        `include_ended=True`, or those in `state` (ended or not); only those carrying every
        `metadata` label given, of `template`, created after `started_after`. With `limit`,
        one page: pass its `next_token` back (same filters) for the next. Each item is a
        handle on this client's connections."""
        infos, token = await self._http.run(_streams.list_page_call(
            state, metadata, include_ended, template=template, started_after=started_after,
            limit=limit, next_token=next_token))
        return SandboxPage([AsyncSandbox(info, self._http) for info in infos], token)

    async def get(self, sandbox_id: str) -> SandboxInfo:
        """The current state of sandbox `sandbox_id`."""
        return await self._http.run(_base.get_sandbox_call(sandbox_id))

    async def create(self, template: str = DEFAULT_TEMPLATE, ttl_seconds: int | None = None,
                     persistent: bool = False, vcpus: int | None = None,
                     memory_mb: int | None = None, env: Mapping[str, str] | None = None,
                     metadata: Mapping[str, str] | None = None, *,
                     disk_mb: int | None = None, snapshot: str | None = None,
                     network: _base.NetworkArg | None = None,
                     volumes: Sequence[_base.VolumeArg] | None = None,
                     name: str | None = None, host_id: str | None = None) -> AsyncSandbox:
        """Create a sandbox (arguments as `Sandbox.create`); it uses this client's connections."""
        return AsyncSandbox(await acreate_waiting(self._http, _base.create_sandbox_call(
            template=template, ttl_seconds=ttl_seconds, persistent=persistent, vcpus=vcpus,
            memory_mb=memory_mb, disk_mb=disk_mb, env=env, metadata=metadata,
            snapshot=snapshot, network=network, volumes=volumes, name=name,
            host_id=host_id)), self._http)

    async def get_or_create(self, name: str, template: str = DEFAULT_TEMPLATE,
                            ttl_seconds: int | None = None, persistent: bool = False,
                            vcpus: int | None = None, memory_mb: int | None = None,
                            env: Mapping[str, str] | None = None,
                            metadata: Mapping[str, str] | None = None, *,
                            disk_mb: int | None = None,
                            snapshot: str | None = None, network: _base.NetworkArg | None = None,
                            volumes: Sequence[_base.VolumeArg] | None = None,
                            host_id: str | None = None) -> AsyncSandbox:
        """The team's live sandbox named `name`, or a new one (as `Sandbox.get_or_create`);
        it uses this client's connections."""
        create = _base.create_sandbox_call(
            template=template, ttl_seconds=ttl_seconds, persistent=persistent, vcpus=vcpus,
            memory_mb=memory_mb, disk_mb=disk_mb, env=env, metadata=metadata,
            snapshot=snapshot, network=network, volumes=volumes, name=name,
            host_id=host_id)
        info = await acreate_waiting(self._http, _names.get_or_create_call(create, name))
        return AsyncSandbox(info, self._http)

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on the existing sandbox `sandbox_id` (or the live one of that name),
        using this client's connections."""
        return AsyncSandbox(await self.get(sandbox_id), self._http)

    async def kill(self, sandbox_id: str) -> None:
        """Kill sandbox `sandbox_id` (`NotFoundError` if there is none)."""
        await self._http.run(_base.kill_sandbox_call(sandbox_id))


class AsyncKeys(_base.ClientBase[AsyncHTTP]):
    """`client.keys`: API keys (async; needs a key allowed to manage keys)."""

    async def create(self, name: str, team: str | None = None) -> CreatedKey:
        """Create a key; the secret is in `.key` and is shown only this once."""
        return await self._http.run(_admin.create_key_call(name, team))

    async def list(self) -> builtins.list[KeyInfo]:
        """The keys of this team (without secrets)."""
        return await self._http.run(_admin.list_keys_call())

    async def revoke(self, key_id: str) -> None:
        """Revoke key `key_id`; requests made with it fail from now on."""
        await self._http.run(_admin.revoke_key_call(key_id))


class AsyncSnapshots(_base.ClientBase[AsyncHTTP]):
    """`client.snapshots`: the team's snapshots (make them with `AsyncSandbox.snapshot()`)."""

    async def list(self) -> builtins.list[SnapshotInfo]:
        """The snapshots of this key's team, oldest first."""
        return await self._http.run(_base.list_snapshots_call())

    async def get(self, snapshot_id: str) -> SnapshotInfo:
        """Snapshot `snapshot_id` (`NotFoundError` if there is none in this team)."""
        return await self._http.run(_base.get_snapshot_call(snapshot_id))

    async def delete(self, snapshot_id: str) -> None:
        """Delete snapshot `snapshot_id`; sandboxes created from it keep running."""
        await self._http.run(_base.delete_snapshot_call(snapshot_id))


class AsyncHosts(_base.ClientBase[AsyncHTTP]):
    """`client.hosts`: the hosts of a cluster (async; needs an admin key; a server that
    drives one host lists none and refuses a drain with `ConflictError`)."""

    async def list(self) -> builtins.list[HostInfo]:
        """Every registered host: live, draining, stale or lost."""
        return await self._http.run(_admin.list_hosts_call())

    async def get(self, host_id: str) -> HostInfo:
        """Host `host_id` (`NotFoundError` if none is registered)."""
        return await self._http.run(_admin.get_host_call(host_id))

    async def drain(self, host_id: str) -> DrainResult:
        """Let host `host_id` take no new sandbox and move its running and paused ones to
        other hosts (same ids); returns when every move is done or failed. Draining again
        retries the ones that failed."""
        return await self._http.run(_admin.drain_host_call(host_id,
                                                          base_timeout=self._http.timeout))

    async def undrain(self, host_id: str) -> HostInfo:
        """Let host `host_id` take new sandboxes again (the moved ones stay where they are)."""
        return await self._http.run(_admin.undrain_host_call(host_id))


class AsyncClient(_base.ClientBase[AsyncHTTP]):
    """A pandastack API client on asyncio. `api_url`/`api_key` override the environment and
    config file (see `pandastack.sdk.config`); `timeout` is the HTTP timeout of ordinary
    requests; `ca_bundle` is the PEM file of the CA that issued an https:// server's
    certificate (PANDASTACK_CA_BUNDLE; default: the system's CAs); `transport` replaces
    httpx's transport (e.g. `httpx.MockTransport` in tests)."""

    def __init__(self, api_url: str | None = None, api_key: str | None = None, *,
                 timeout: TimeoutTypes = DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None,
                 ca_bundle: str | os.PathLike[str] | None = None) -> None:
        config = resolve_config(api_url, api_key, timeout=timeout, ca_bundle=ca_bundle)
        super().__init__(config, AsyncHTTP(config, transport))
        self._sandboxes = AsyncSandboxes(config, self._http)
        self._keys = AsyncKeys(config, self._http)
        self._snapshots = AsyncSnapshots(config, self._http)
        self._templates = AsyncTemplates(config, self._http)
        self._hosts = AsyncHosts(config, self._http)
        self._teams = AsyncTeams(config, self._http)
        self._volumes = AsyncVolumes(config, self._http)
        self._events = AsyncEvents(config, self._http)
        self._webhooks = AsyncWebhooks(config, self._http)
        self._registries = AsyncRegistries(config, self._http)

    @property
    def sandboxes(self) -> AsyncSandboxes:
        """List, inspect, create and kill sandboxes."""
        return self._sandboxes

    @property
    def keys(self) -> AsyncKeys:
        """Manage API keys."""
        return self._keys

    @property
    def snapshots(self) -> AsyncSnapshots:
        """List, inspect and delete the team's snapshots."""
        return self._snapshots

    @property
    def templates(self) -> AsyncTemplates:
        """Build the team's templates; list, inspect and delete their versions."""
        return self._templates

    @property
    def hosts(self) -> AsyncHosts:
        """List a cluster's hosts; drain and undrain them (admin keys)."""
        return self._hosts

    @property
    def teams(self) -> AsyncTeams:
        """Set and read teams' quotas (admin keys)."""
        return self._teams

    @property
    def volumes(self) -> AsyncVolumes:
        """Create, list, inspect, grow and delete the team's volumes."""
        return self._volumes

    @property
    def events(self) -> AsyncEvents:
        """The team's event log, live (`await events.stream()`)."""
        return self._events

    @property
    def webhooks(self) -> AsyncWebhooks:
        """Create, list, test and delete the team's webhooks; their delivery logs."""
        return self._webhooks

    @property
    def registries(self) -> AsyncRegistries:
        """The team's credentials for image registries (template builds pull with them)."""
        return self._registries

    async def usage(self, start: TimeArg | None = None, end: TimeArg | None = None,
                    group_by: UsageGroupBy = "sandbox", *,
                    team: str | None = None) -> UsageReport:
        """What this key's team held in [start, end) and what it cost, per sandbox, day or
        template (default: this month so far). An admin key sees every team, or `team`."""
        return await self._http.run(usage_call(start, end, group_by, team))

    async def close(self) -> None:
        """Close the connection pool (sandbox handles made by this client stop working)."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
