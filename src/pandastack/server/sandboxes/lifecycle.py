"""TTL expiry, the idle reaper and the idle hibernation policy: one background task that
ticks about once a second."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pandastack.hostport.errors import HostUnavailable, SandboxNotFound

from ..events.log import prune as prune_events
from ..settings import Settings
from ..store import Sandbox, Store
from ..web.errors import ApiError
from .service import AWAKE_STATES, SandboxService
from .stopped import ORPHAN_SNAPSHOT_GRACE_SECONDS, remove_orphan_snapshots

log = logging.getLogger("pandastack.server")


#: `sandboxes.on_expiry`: what a TTL ends in, when not the sandbox. HIBERNATE (E2B's
#: autoPause): it is hibernated, and the row says SPENT until a new timeout is set (E2B's
#: set_timeout or connect re-arm it), so a sandbox woken after its TTL is not hibernated
#: again at once; the idle rule hibernates it meanwhile.
HIBERNATE = "hibernate"
SPENT = "spent"
#: Either of the two with this suffix: traffic to its ports wakes it while it is hibernated
#: (E2B's autoResume); without, only an explicit wake (E2B's connect) does.
WAKE = "+wake"
KEPT = frozenset({HIBERNATE, SPENT, HIBERNATE + WAKE, SPENT + WAKE})


def kept(on_expiry: str | None) -> bool:
    """Whether a TTL hibernates the sandbox instead of ending it."""
    return on_expiry in KEPT


def spent(on_expiry: str | None) -> bool:
    return on_expiry is not None and on_expiry.startswith(SPENT)


def spend(on_expiry: str) -> str:
    """The value once its TTL has hibernated it (the wake-on-traffic choice kept)."""
    return SPENT + on_expiry.removeprefix(HIBERNATE).removeprefix(SPENT)


def armed(on_expiry: str | None) -> str | None:
    """The value once a new TTL is set: a spent one hibernates again at it."""
    if on_expiry is None or not spent(on_expiry):
        return on_expiry
    return HIBERNATE + on_expiry.removeprefix(SPENT)


def wakes_on_traffic(on_expiry: str | None) -> bool:
    return kept(on_expiry) and on_expiry is not None and on_expiry.endswith(WAKE)

#: E2B's on_timeout "kill": the timeout is its whole lifetime, as on E2B, which has no idle
#: rule (a sandbox given an hour and left idle for ten minutes is still there; the timeout,
#: bounded by MAX_TTL_SECONDS, reclaims a forgotten one).
TIMEOUT_ONLY = "timeout"


@dataclass(frozen=True)
class Verdict:
    state: str  # "expired" | "reaped" | "failed" | HIBERNATE (kept, not ended)
    reason: str


def decide(*, state: str, persistent: bool, expires_at: float | None,
           last_activity_at: float, busy: bool, now: float,
           idle_timeout: float, on_expiry: str | None = None) -> Verdict | None:
    """Whether a sandbox must end now. Persistent sandboxes are exempt from both rules; an
    operation in flight (exec, stream, upload) holds off the idle rule but never the TTL.
    The TTL holds in every live state; the idle rule spares hibernated sandboxes (they hold
    no RAM or CPU, only disk).

    With `on_expiry` set (E2B's autoPause), where either rule would end the sandbox it is
    hibernated instead (Verdict HIBERNATE), and one without a VM (hibernated, stopped, on a
    lost host) is kept past its TTL; once SPENT, only the idle rule applies. TIMEOUT_ONLY:
    the idle rule does not apply."""
    keep = kept(on_expiry)
    if keep and state in ("host_lost", "stopped", "hibernated"):
        return None
    if state == "host_lost" and not persistent and expires_at is not None and now >= expires_at:
        return Verdict("expired", "ttl elapsed (its host was lost)")
    if state == "stopped" and not persistent and expires_at is not None and now >= expires_at:
        return Verdict("expired", "ttl elapsed (it was stopped)")  # made non-persistent since
    if state not in AWAKE_STATES or persistent:
        return None
    if expires_at is not None and now >= expires_at and not spent(on_expiry):
        return Verdict(HIBERNATE, "timeout elapsed") if keep else Verdict("expired",
                                                                          "ttl elapsed")
    if on_expiry == TIMEOUT_ONLY:
        return None
    if state != "hibernated" and not busy and now - last_activity_at >= idle_timeout:
        reason = f"no API activity for {idle_timeout:g} s"
        return Verdict(HIBERNATE, reason) if keep else Verdict("reaped", reason)
    return None


async def hibernate_kept(service: SandboxService, row: Sandbox, verdict: Verdict,
                         now: float) -> None:
    """A HIBERNATE verdict: hibernated (the team's max_hibernated applies), its TTL then
    SPENT. Past the team's quota it ends as the rule would have ended it (a timeout bounds
    running either way); another failure (its host) is tried again on the next pass."""
    try:
        await service.hibernate_row(row)
    except ApiError as exc:
        if exc.status != 429:
            log.warning("sandbox %s: hibernating it (%s) failed: %s", row.id, verdict.reason,
                        exc.message)
            return
        log.warning("sandbox %s: %s, over the team's quota to hibernate: it ends", row.id,
                    verdict.reason)
        await service.end(row.id, "expired", f"{verdict.reason}; hibernating it was "
                          f"refused: {exc.message}"[:2000])
        return
    if row.expires_at is not None and now >= row.expires_at and row.on_expiry is not None:
        await asyncio.to_thread(service.store.update_sandbox, row.id,
                                on_expiry=spend(row.on_expiry))
    log.info("sandbox %s hibernated: %s", row.id, verdict.reason)


def should_hibernate(*, state: str, persistent: bool, last_activity_at: float, busy: bool,
                     now: float, hibernate_idle: float | None) -> bool:
    """The idle hibernation policy (off when `hibernate_idle` is None): a running persistent
    sandbox without API activity for that long is hibernated instead of left running."""
    return (hibernate_idle is not None and persistent and state == "running" and not busy
            and now - last_activity_at >= hibernate_idle)


async def _vm_gone(service: SandboxService, row: Sandbox) -> bool:
    """Whether the VM of a live row died (a hibernated one has none and needs none). A
    host that cannot be reached says nothing: its sandboxes are not gone, only out of reach."""
    try:
        handle = await service.runtime.get(row.id)
    except SandboxNotFound:
        return True
    except HostUnavailable:
        return False
    return handle.state != "hibernated" and not handle.is_alive()


async def _healthy_on_host(service: SandboxService) -> dict[str, str]:
    """The sandboxes the host runs with a live VM or holds hibernated, by id, with their
    state: one listing for the whole sweep instead of a lookup per sandbox (each a round
    trip to an agent). Empty when the host cannot be reached (every row is then looked up
    on its own, as before)."""
    try:
        listed = await service.runtime.list_sandboxes()
    except HostUnavailable:
        return {}
    return {s.id: s.state for s in listed if s.state == "hibernated" or s.is_alive()}


async def sweep(service: SandboxService, now: float | None = None, *,
                purge_due: bool = True) -> list[tuple[str, str]]:
    """One pass: end what must end, fail what died (a persistent one is stopped instead,
    its disk kept: ADR 0037), and with `purge_due` purge what is past retention (ended
    sandboxes, failed and deleted template versions, old events)."""
    now = time.time() if now is None else now
    settings = service.settings
    ended: list[tuple[str, str]] = []
    for sid in await asyncio.to_thread(service.mark_lost_hosts):
        log.warning("sandbox %s: its host was lost", sid)
    rows = await asyncio.to_thread(service.store.live_sandboxes)
    # Listed after the rows are read: a row that is running had its VM before the read.
    healthy = await _healthy_on_host(service)
    for row in rows:
        busy = service.is_busy(row.id)
        verdict = decide(state=row.state, persistent=row.persistent, expires_at=row.expires_at,
                         last_activity_at=row.last_activity_at, busy=busy, now=now,
                         idle_timeout=settings.idle_timeout_seconds, on_expiry=row.on_expiry)
        # a state change in flight may have the VM process briefly gone: not a failure
        steady = row.state in AWAKE_STATES and not service.in_transition(row.id)
        # A row the listing shows healthy in the row's own state needs nothing more; any
        # other is looked up on its own, which also settles a listing that went stale.
        if verdict is None and steady and healthy.get(row.id) != row.state:
            if await _vm_gone(service, row):
                if row.persistent:
                    await asyncio.to_thread(service.stop_row, row, "VM exited unexpectedly")
                    continue
                verdict = Verdict("failed", "VM exited unexpectedly")
            else:
                row = await service.sync_state(row)
        if verdict is not None and verdict.state == HIBERNATE:
            if steady:
                await hibernate_kept(service, row, verdict, now)
        elif verdict is not None:
            await service.end(row.id, verdict.state, verdict.reason)
            ended.append((row.id, verdict.state))
        elif steady and should_hibernate(
                state=row.state, persistent=row.persistent,
                last_activity_at=row.last_activity_at, busy=busy, now=now,
                hibernate_idle=settings.hibernate_idle_seconds):
            try:
                await service.hibernate_row(row)
                log.info("sandbox %s hibernated after %s s idle", row.id,
                         settings.hibernate_idle_seconds)
            except ApiError as exc:
                log.warning("hibernating idle sandbox %s failed: %s", row.id, exc.message)
    if purge_due:
        await asyncio.to_thread(purge, service.store, now - settings.retention_seconds)
        await asyncio.to_thread(prune_events, service.store, now,
                                settings.event_retention_seconds)
    return ended


# How often the reaper purges (its sweeps run every second): the purge's DELETEs were ~40 % of
# an idle server's CPU, and whatever request they land beside waits for the loop. A retention
# shorter than this purges on every sweep.
PURGE_EVERY_SECONDS = 60.0


def purge_every(settings: Settings) -> float:
    return min(PURGE_EVERY_SECONDS, float(settings.retention_seconds))


# What a stop may spend hibernating (a hibernation writes the guest's memory to disk: about
# a second per 256 MiB here); the sandboxes not reached by then keep running.
HIBERNATE_ON_STOP_SECONDS = 120.0


async def hibernate_persistent(service: SandboxService,
                               budget: float = HIBERNATE_ON_STOP_SECONDS) -> list[str]:
    """At a stop with `hibernate_on_stop`: hibernate each running persistent sandbox, one at
    a time, within `budget` seconds; a failure is logged and the sandbox keeps running (the
    next start adopts it). Returns the ids hibernated."""
    done: list[str] = []
    rows = [r for r in service.store.live_sandboxes()
            if r.persistent and r.state == "running" and not service.in_transition(r.id)]
    try:
        async with asyncio.timeout(budget):
            for row in rows:
                try:
                    # The server's own stop: a team's max_hibernated does not keep it up.
                    await service.hibernate_row(row, quota=False)
                    done.append(row.id)
                except ApiError as exc:
                    log.warning("stop: hibernating sandbox %s failed: %s", row.id, exc.message)
    except TimeoutError:
        log.warning("stop: %d of %d persistent sandboxes hibernated within %.0f s; the others "
                    "keep running", len(done), len(rows), budget)
    if done:
        log.info("stop: hibernated %d persistent sandboxes: %s", len(done), ", ".join(done))
    return done


def purge(store: Store, before: float) -> None:
    """Remove what ended before `before`: sandbox rows, and template versions that failed
    or were deleted (with their specs and logs; their version numbers stay taken)."""
    store.purge_ended(before)
    pruned = store.purge_template_versions(before)
    if pruned:
        log.info("pruned %d failed or deleted template versions", pruned)


async def catch_up(service: SandboxService, reconcile: Callable[[], Awaitable[None]]) -> None:
    """What waits for the host to answer again: the reconcile a startup without it skipped
    (`reconcile`), and the kills of sandboxes that ended while it was out of reach."""
    if service.needs_reconcile:
        try:
            await reconcile()
        except HostUnavailable:
            return
        service.needs_reconcile = False
        log.info("host answers again: reconciled with the store")
    if service.unkilled:
        for sid in await service.retry_kills():
            log.info("sandbox %s: its VM was killed after its host came back", sid)


# How often a running server removes snapshots a crash left without a row (past their grace).
ORPHAN_SWEEP_SECONDS = ORPHAN_SNAPSHOT_GRACE_SECONDS / 4


async def reaper(service: SandboxService,
                 reconcile: Callable[[], Awaitable[None]] | None = None) -> None:
    """Runs until cancelled; a failing pass is logged and the next one tries again."""
    orphans_swept = time.monotonic()
    purged_at = -math.inf
    while True:
        try:
            if reconcile is not None:
                await catch_up(service, reconcile)
            purge_due = time.monotonic() - purged_at >= purge_every(service.settings)
            for sid, state in await sweep(service, purge_due=purge_due):
                log.info("sandbox %s ended: %s", sid, state)
            if purge_due:
                purged_at = time.monotonic()
            if (service.cluster is None
                    and time.monotonic() - orphans_swept > ORPHAN_SWEEP_SECONDS):
                orphans_swept = time.monotonic()
                await remove_orphan_snapshots(service)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("lifecycle sweep failed")
        await asyncio.sleep(service.settings.reaper_interval_seconds)
