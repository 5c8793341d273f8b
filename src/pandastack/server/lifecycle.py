"""TTL expiry and the idle reaper: one background task that ticks about once a second."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from pandastack.host.errors import SandboxNotFound

from .service import SandboxService

log = logging.getLogger("pandastack.server")


@dataclass(frozen=True)
class Verdict:
    state: str  # "expired" | "reaped" | "failed"
    reason: str


def decide(*, state: str, persistent: bool, expires_at: float | None,
           last_activity_at: float, busy: bool, now: float,
           idle_timeout: float) -> Verdict | None:
    """Whether a sandbox must end now. Persistent sandboxes are exempt from both rules; an
    operation in flight (exec, stream, upload) holds off the idle rule but never the TTL."""
    if state != "running" or persistent:
        return None
    if expires_at is not None and now >= expires_at:
        return Verdict("expired", "ttl elapsed")
    if not busy and now - last_activity_at >= idle_timeout:
        return Verdict("reaped", f"no API activity for {idle_timeout:g} s")
    return None


async def sweep(service: SandboxService, now: float | None = None) -> list[tuple[str, str]]:
    """One pass: end what must end, fail what died, purge what is past retention."""
    now = time.time() if now is None else now
    settings = service.settings
    ended: list[tuple[str, str]] = []
    for row in service.store.live_sandboxes():
        verdict = decide(state=row.state, persistent=row.persistent, expires_at=row.expires_at,
                         last_activity_at=row.last_activity_at,
                         busy=service.is_busy(row.id), now=now,
                         idle_timeout=settings.idle_timeout_seconds)
        if verdict is None and row.state == "running":
            try:
                alive = service.runtime.get(row.id).is_alive()
            except SandboxNotFound:
                alive = False
            if not alive:
                verdict = Verdict("failed", "VM exited unexpectedly")
        if verdict is not None:
            await service.end(row.id, verdict.state, verdict.reason)
            ended.append((row.id, verdict.state))
    service.store.purge_ended(now - settings.retention_seconds)
    return ended


async def reaper(service: SandboxService) -> None:
    """Runs until cancelled; a failing pass is logged and the next one tries again."""
    while True:
        try:
            for sid, state in await sweep(service):
                log.info("sandbox %s ended: %s", sid, state)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("lifecycle sweep failed")
        await asyncio.sleep(service.settings.reaper_interval_seconds)
