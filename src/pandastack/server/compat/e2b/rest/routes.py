"""E2B's REST API for sandboxes (create, connect, list, get, kill, timeout, pause, fork,
snapshots, metrics, network) over the service calls our /v1 routes make: the same keys,
teams, quotas, metering, egress rules and events. Mounted without a prefix and left out of
our OpenAPI contract (app.py)."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse, Response

from pandastack.hostport.errors import HostError, SandboxNotFound
from pandastack.rules import SNAPSHOT_ID_RE
from pandastack.server.accounts.auth import Principal
from pandastack.server.routes.deps import SandboxId
from pandastack.server.sandboxes.lifecycle import (
    HIBERNATE,
    TIMEOUT_ONLY,
    WAKE,
    armed,
    kept,
    spent,
    wakes_on_traffic,
)
from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.sandboxes.snapshots import delete_snapshot, fork, take_snapshot
from pandastack.server.settings import Settings
from pandastack.server.store import Sandbox
from pandastack.server.store.listing import BadPageToken, SandboxFilter
from pandastack.server.web.errors import ApiError
from pandastack.wire.sandboxes import NetworkSpec

from ..errors import E2bError
from .base import AppSettings, Caller, E2bRoute, Service, domain, tokens
from .models import (
    Connect,
    Fork,
    NetworkUpdate,
    NewSandbox,
    Pause,
    Refresh,
    Resume,
    SnapshotRequest,
    Timeout,
)
from .snapshot_list import snapshot_page
from .states import ALL_OURS, GONE, OURS, our_template, past_timeout
from .translate import (
    E2B_DEFAULT_TIMEOUT,
    E2B_V1_DEFAULT_TIMEOUT,
    bad,
    create_request,
    created,
    detail,
    listed,
    metric,
    network_update,
)

router = APIRouter(route_class=E2bRoute, include_in_schema=False)

MAX_PAGE = 100  # E2B's largest page, and its default
MAX_METRICS_IDS = 100
METRIC_SLACK_SECONDS = 5
TemplateId = Annotated[str, Path(max_length=256)]


def not_found(sandbox_id: str) -> E2bError:
    return E2bError(404, f"sandbox {sandbox_id!r} not found")


def live_row(service: SandboxService, team: str, sandbox_id: str, *,
             touch: bool = True) -> Sandbox:
    """The team's sandbox that has not ended; an ended one is gone to E2B (404)."""
    try:
        row = service.row(team, sandbox_id, touch=touch)
    except ApiError as exc:
        if exc.status == 404:
            raise not_found(sandbox_id) from None
        raise
    if row.state in GONE or past_timeout(row):
        raise not_found(sandbox_id)
    return row


def sandbox(service: SandboxService, row: Sandbox, settings: Settings,
            status: int = 201) -> JSONResponse:
    return JSONResponse(created(service.info(row), tokens(service), domain(settings)),
                        status_code=status)


def set_timeout_of(service: SandboxService, team: str, row: Sandbox, timeout: int) -> Sandbox:
    """`timeout` seconds from now; an autoPause sandbox whose last timeout hibernated it is
    armed again for this one (lifecycle.SPENT)."""
    row = service.set_lifecycle(team, row.id, None, None, timeout_seconds=timeout)
    if spent(row.on_expiry):
        row = service.store.update_sandbox(row.id, on_expiry=armed(row.on_expiry)) or row
    return row


def extend(service: SandboxService, team: str, row: Sandbox, timeout: int) -> Sandbox:
    """E2B's connect: the sandbox then lives at least `timeout` more seconds (only
    extended, never shortened)."""
    if row.expires_at is not None and row.expires_at >= time.time() + timeout:
        return row
    return set_timeout_of(service, team, row, timeout)


# -- create ------------------------------------------------------------------------------


async def made(service: SandboxService, team: str, body: NewSandbox,
               default_timeout: int) -> Sandbox:
    row = await service.create(team, create_request(body, default_timeout))
    # its timeout hibernates it (autoPause) or ends it; no idle rule either way
    return service.store.update_sandbox(
        row.id, on_expiry=on_timeout(body.auto_pause, resumes(body))) or row


def resumes(body: NewSandbox) -> bool:
    """E2B's autoResume: traffic to its ports wakes it (only with autoPause, as E2B says)."""
    return body.auto_resume is not None and body.auto_resume.enabled


def on_timeout(auto_pause: bool | None, auto_resume: bool = False) -> str:
    if not auto_pause:
        if auto_resume:
            raise E2bError(400, "autoResume needs autoPause (a sandbox its timeout kills "
                           "cannot resume)")
        return TIMEOUT_ONLY
    return HIBERNATE + WAKE if auto_resume else HIBERNATE


@router.post("/v2/sandboxes")
async def create_v2(body: NewSandbox, who: Caller, service: Service,
                    settings: AppSettings) -> Response:
    row = await made(service, who.team, body, E2B_DEFAULT_TIMEOUT)
    return sandbox(service, row, settings)


@router.post("/sandboxes")
async def create_v1(body: NewSandbox, who: Caller, service: Service,
                    settings: AppSettings) -> Response:
    row = await made(service, who.team, body, E2B_V1_DEFAULT_TIMEOUT)
    return sandbox(service, row, settings)


# -- list --------------------------------------------------------------------------------


def metadata_filter(text: str | None) -> dict[str, str]:
    """E2B's `metadata=` query: `k=v&k2=v2`, each key and value URL-encoded once more by
    the SDK before the whole is."""
    if not text:
        return {}
    try:
        pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise bad("metadata: expected key=value pairs joined by '&'") from None
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


def state_filter(text: str | None) -> tuple[str, ...]:
    """The states of ours left out for E2B's `state=running,paused` (none: both)."""
    wanted: set[str] = set()
    for name in (text or "running,paused").split(","):
        name = name.strip()
        if name not in OURS:
            raise bad(f"state: {name!r} is not one of running, paused")
        wanted.update(OURS[name])
    return tuple(sorted(ALL_OURS - wanted))


def started_after_filter(text: str | None) -> float | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise bad("startedAfter: expected an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise bad("startedAfter: the time needs its offset (Z or +hh:mm)")
    return moment.timestamp() - 1e-6  # E2B's is "at or after", ours "after"


@router.get("/v2/sandboxes")
async def list_v2(who: Caller, service: Service,
                  metadata: Annotated[str | None, Query(max_length=4096)] = None,
                  state: Annotated[str | None, Query(max_length=64)] = None,
                  template: Annotated[str | None, Query(max_length=128)] = None,
                  started_after: Annotated[str | None, Query(alias="startedAfter",
                                                             max_length=64)] = None,
                  # E2B's default: newest first (by start time)
                  order: Annotated[str | None, Query(max_length=8)] = None,
                  limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
                  next_token: Annotated[str | None, Query(alias="nextToken",
                                                          max_length=512)] = None,
                  ) -> Response:
    if order not in (None, "asc", "desc"):
        raise bad("order: asc or desc")
    where = SandboxFilter(exclude_states=state_filter(state),
                          template=our_template(template) if template else None,
                          started_after=started_after_filter(started_after),
                          metadata=metadata_filter(metadata))
    try:
        rows, token = service.store.page_sandboxes(who.team, where, limit=limit,
                                                   after=next_token,
                                                   newest_first=order != "asc")
    except BadPageToken as exc:
        raise bad(f"nextToken: {exc}") from None
    return JSONResponse([listed(i) for i in service.infos(rows)],
                        headers={"X-Next-Token": token} if token else None)


@router.get("/sandboxes")
async def list_v1(who: Caller, service: Service,
                  metadata: Annotated[str | None, Query(max_length=4096)] = None,
                  ) -> Response:
    """The older list: every running sandbox in one answer."""
    where = SandboxFilter(exclude_states=state_filter("running"),
                          metadata=metadata_filter(metadata))
    rows, _ = service.store.page_sandboxes(who.team, where, limit=None, after=None)
    return JSONResponse([listed(i) for i in service.infos(rows)])


# -- metrics (before /sandboxes/{id}, which would take "metrics" for an id) ---------------


async def measure(service: SandboxService, row: Sandbox) -> dict[str, Any] | None:
    """One measurement in the guest now; None when there is no running VM to measure (a
    read never wakes one, as on our own metrics route)."""
    if row.state != "running":
        return None
    try:
        handle = service.runtime.handle(row.id)
        return metric(await service.host_call(handle.metrics()), time.time())
    except (SandboxNotFound, HostError):
        return None
    except ApiError as exc:
        if exc.status in (409, 503):
            return None
        raise


@router.get("/sandboxes/metrics")
async def metrics_many(who: Caller, service: Service,
                       sandbox_ids: Annotated[str, Query(max_length=8192)]) -> Response:
    ids = [i for i in dict.fromkeys(sandbox_ids.split(",")) if i]
    if len(ids) > MAX_METRICS_IDS:
        raise bad(f"sandbox_ids: at most {MAX_METRICS_IDS}")
    rows = [row for row in (service.store.get_sandbox(who.team, i) for i in ids)
            if row is not None and row.state not in GONE]  # another team's: as none
    # Each measures over the same window in its own guest: at once, not one after another.
    measured = await asyncio.gather(*(measure(service, row) for row in rows))
    return JSONResponse({"sandboxes": {row.id: m for row, m in zip(rows, measured, strict=True)
                                       if m is not None}})


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics_one(sandbox_id: SandboxId, who: Caller, service: Service,
                      start: Annotated[int | None, Query(ge=0)] = None,
                      end: Annotated[int | None, Query(ge=0)] = None) -> Response:
    """One measurement, taken now: none when the range asked for does not hold now (E2B's
    are seconds, and its samples fall in buckets: a few seconds of slack either side)."""
    row = live_row(service, who.team, sandbox_id, touch=False)
    now = time.time()
    if (end is not None and end < now - METRIC_SLACK_SECONDS) or \
            (start is not None and start > now + METRIC_SLACK_SECONDS):
        return JSONResponse([])
    m = await measure(service, row)
    return JSONResponse([] if m is None else [m])


# -- one sandbox --------------------------------------------------------------------------


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: SandboxId, who: Caller, service: Service,
                      settings: AppSettings) -> Response:
    row = live_row(service, who.team, sandbox_id)
    network: NetworkSpec | None
    try:
        network = await service.network(who.team, row.id)
    except (ApiError, HostError):
        network = None  # its host is out of reach or lost: the rest is still true
    return JSONResponse(detail(service.info(row), tokens(service), domain(settings), network,
                               kept=kept(row.on_expiry), wakes=wakes_on_traffic(row.on_expiry)))


@router.delete("/sandboxes/{sandbox_id}")
async def kill_sandbox(sandbox_id: SandboxId, who: Caller, service: Service) -> Response:
    live_row(service, who.team, sandbox_id, touch=False)
    await service.delete(who.team, sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout")
async def set_timeout(sandbox_id: SandboxId, body: Timeout, who: Caller,
                      service: Service) -> Response:
    set_timeout_of(service, who.team, live_row(service, who.team, sandbox_id), body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes")
async def refresh(sandbox_id: SandboxId, who: Caller, service: Service,
                  body: Refresh | None = None) -> Response:
    row = live_row(service, who.team, sandbox_id)
    duration = E2B_V1_DEFAULT_TIMEOUT if body is None or body.duration is None \
        else body.duration
    extend(service, who.team, row, duration)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause")
async def pause(sandbox_id: SandboxId, who: Caller, service: Service,
                body: Pause | None = None) -> Response:
    """E2B's pause is our hibernate: memory and processes kept, no VM left running (with
    `memory: false` too: we keep more than asked). 409 when E2B would call it paused."""
    row = live_row(service, who.team, sandbox_id)
    if row.state in OURS["paused"]:
        raise E2bError(409, f"sandbox {sandbox_id} is already paused ({row.state})")
    await service.hibernate(who.team, sandbox_id)
    return Response(status_code=204)


async def wake(service: SandboxService, team: str, row: Sandbox) -> Sandbox:
    """A sandbox E2B reads as paused, running again: our resume for vCPUs stopped in place,
    our wake for the others (hibernated, stopped, on a lost host)."""
    if row.state == "paused":
        return await service.resume(team, row.id)
    return await service.wake(team, row.id)


async def connect(sandbox_id: str, timeout: int, who: Principal, service: SandboxService,
                  settings: Settings) -> Response:
    row = live_row(service, who.team, sandbox_id)
    woke = row.state != "running"
    if woke:
        row = await wake(service, who.team, row)
    row = extend(service, who.team, row, timeout)
    return sandbox(service, row, settings, 201 if woke else 200)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect_v2(sandbox_id: SandboxId, who: Caller, service: Service,
                     settings: AppSettings, body: Connect | None = None) -> Response:
    timeout = E2B_DEFAULT_TIMEOUT if body is None or body.timeout is None else body.timeout
    return await connect(sandbox_id, timeout, who, service, settings)


@router.post("/sandboxes/{sandbox_id}/connect")
async def connect_v1(sandbox_id: SandboxId, body: Connect, who: Caller, service: Service,
                     settings: AppSettings) -> Response:
    if body.timeout is None:
        raise bad("timeout: field required")
    return await connect(sandbox_id, body.timeout, who, service, settings)


@router.post("/sandboxes/{sandbox_id}/resume")
async def resume(sandbox_id: SandboxId, who: Caller, service: Service,
                 settings: AppSettings, body: Resume | None = None) -> Response:
    """The deprecated form of connect: 409 for a sandbox that is already running."""
    row = live_row(service, who.team, sandbox_id)
    if row.state == "running":
        raise E2bError(409, f"sandbox {sandbox_id} is already running")
    row = await wake(service, who.team, row)
    if body is not None and body.auto_pause is not None:
        wakes = bool(body.auto_pause) and wakes_on_traffic(row.on_expiry)
        row = service.store.update_sandbox(
            row.id, on_expiry=on_timeout(body.auto_pause, wakes)) or row
    timeout = E2B_V1_DEFAULT_TIMEOUT if body is None or body.timeout is None else body.timeout
    row = extend(service, who.team, row, timeout)
    return sandbox(service, row, settings)


@router.post("/sandboxes/{sandbox_id}/fork")
async def fork_sandbox(sandbox_id: SandboxId, who: Caller, service: Service,
                       settings: AppSettings, body: Fork | None = None) -> Response:
    """Children with the parent's memory, processes and files; each gets `timeout` from
    now when the body names one, else the parent's lifecycle, and the parent's autoPause."""
    live_row(service, who.team, sandbox_id)
    count = 1 if body is None or body.count is None else body.count
    forked = await fork(service, who.team, sandbox_id, count)
    parent, children = forked.parent, forked.children
    if parent.on_expiry is not None:
        children = [service.store.update_sandbox(c.id, on_expiry=armed(parent.on_expiry))
                    or c for c in children]
    if body is not None and body.timeout is not None:
        children = [service.set_lifecycle(who.team, c.id, None, None,
                                          timeout_seconds=body.timeout) for c in children]
    made = [created(i, tokens(service), domain(settings)) for i in service.infos(children)]
    return JSONResponse([{"sandbox": s} for s in made], status_code=201)


@router.put("/sandboxes/{sandbox_id}/network")
async def update_network(sandbox_id: SandboxId, body: NetworkUpdate, who: Caller,
                         service: Service) -> Response:
    live_row(service, who.team, sandbox_id)
    current = await service.network(who.team, sandbox_id)
    await service.update_network(who.team, sandbox_id, network_update(current, body),
                                 merge=False)
    return Response(status_code=204)


# -- snapshots ---------------------------------------------------------------------------


@router.post("/sandboxes/{sandbox_id}/snapshots")
async def create_snapshot(sandbox_id: SandboxId, who: Caller, service: Service,
                          body: SnapshotRequest | None = None) -> Response:
    live_row(service, who.team, sandbox_id)
    name = None if body is None else body.name
    snap = await take_snapshot(service, who.team, sandbox_id, name)
    return JSONResponse({"snapshotID": snap.id, "names": [snap.name] if snap.name else []},
                        status_code=201)


@router.get("/snapshots")
async def list_snapshots(who: Caller, service: Service,
                         sandbox_id: Annotated[str | None, Query(alias="sandboxID",
                                                                 max_length=64)] = None,
                         name: Annotated[str | None, Query(max_length=128)] = None,
                         limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
                         next_token: Annotated[str | None, Query(alias="nextToken",
                                                                 max_length=128)] = None,
                         ) -> Response:
    rows = [r for r in service.store.list_snapshots(who.team)
            if (sandbox_id is None or r.source_sandbox == sandbox_id)
            and (name is None or r.name == name)]
    page, token = snapshot_page(rows, limit, next_token)
    return JSONResponse([{"snapshotID": r.id, "names": [r.name] if r.name else []}
                         for r in page], headers={"X-Next-Token": token} if token else None)


@router.delete("/templates/{template_id}")
async def delete_template(template_id: TemplateId, who: Caller,
                          service: Service) -> Response:
    """E2B deletes a snapshot as the template it is; any other template is ours to manage
    with our own API."""
    if not SNAPSHOT_ID_RE.match(template_id):
        raise E2bError(501, "deleting templates through E2B's API is not supported by "
                            "pandastack (only snapshots); use DELETE /v1/templates/{name}")
    try:
        await delete_snapshot(service, who.team, template_id)
    except ApiError as exc:
        if exc.status == 404:
            raise E2bError(404, f"snapshot {template_id!r} not found") from None
        raise
    return Response(status_code=204)
