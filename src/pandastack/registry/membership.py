"""An agent's membership in the host registry: it registers, heartbeats, is fenced, and pauses
its VMs when it cannot reach the database.

The invariant is that a sandbox never runs on two hosts at once, while the control plane
treats a host that stopped heartbeating for `stale_after_s` (by the database's clock) as lost:
it fences it (its epoch and leases move on) and may wake the sandbox's saved state
elsewhere. Four rules on the agent's side make that safe:

- **Lease before run.** A VM starts only under a lease this host holds at its current epoch
  (`LeasedHost`); a fence makes every later lease under the old epoch fail.
- **Fenced at start.** After registering and before the host API serves anything, every
  sandbox the runtime re-adopted whose lease is not (this host, this epoch) is killed, and so
  is one with no lease at all (with lease-before-create no create can leave one; it would be
  a VM started by an older agent without a registry, which nobody can vouch for).
- **Fenced while running.** A heartbeat that is refused (the host is at another epoch) means
  the control plane gave up on this host: every call is refused (HostUnavailable, 503) and
  the VMs are paused until the agent has registered again (a new epoch: the fenced leases are
  under the older one) and killed the VMs whose leases are not its own; then it serves again.
- **Self-pause on partition.** A heartbeat that cannot reach the database proves nothing
  about what the control plane decided. The control plane cannot fence this host earlier than
  `stale_after_s` after the database last recorded a heartbeat, and that record is no earlier
  than the moment the agent sent it. So, timing from the send of its last renewed heartbeat
  by the monotonic clock (which no clock step moves), the agent pauses every running VM and
  refuses calls once `PARTITION_SHARE` of the window has passed: the remaining third is the
  margin for the pause itself and for the two clocks' rates. When the database answers again:
  still its epoch, it resumes what it paused (those whose lease is still its own) and serves;
  fenced, it kills them as above.

A frozen agent (SIGSTOP, a machine that stalls) cannot pause anything: its VMs run on while
it is stopped, and die when it runs again and finds itself fenced. Closing that gap needs a
guard in the VMM process itself (a later change).

The database calls are synchronous SQLAlchemy and run in threads; the watchdog that pauses
does not wait for a heartbeat that hangs (a dropped network)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from pandastack.hostport.compat import OURS, Levels
from pandastack.hostport.errors import HostError, HostUnavailable, SandboxNotFound
from pandastack.hostport.protocols import RuntimePort

from .models import Host
from .queries import Registry, Usage

log = logging.getLogger("pandastack.registry")

#: The share of the stale window after which an agent that could not heartbeat pauses its
#: VMs (see the module's docstring).
PARTITION_SHARE = 2 / 3

State = Literal["starting", "serving", "fenced", "partitioned", "closed"]


@dataclass(frozen=True)
class HostFacts:
    """What an agent registers: where API servers reach it and what it has."""

    endpoint: str
    vcpus: int
    memory_mb: int
    disk_mb: int
    labels: dict[str, str] = field(default_factory=dict)
    version: str = ""
    levels: Levels = OURS  # the host API protocol it speaks (hostport/compat.py)


class Membership:
    """One agent's registration. `join()` registers and fences what the runtime re-adopted;
    `start()` begins the heartbeats; `check()` raises HostUnavailable whenever the agent may
    not serve (fenced, partitioned, not joined)."""

    def __init__(self, registry: Registry, facts: HostFacts, runtime: RuntimePort, *,
                 heartbeat_s: float = 5.0, stale_after_s: float = 15.0,
                 usage: Callable[[], Awaitable[Usage]] | None = None) -> None:
        if not 0 < heartbeat_s < stale_after_s * PARTITION_SHARE:
            raise ValueError(f"heartbeat_s must be above 0 and below {PARTITION_SHARE:.2f} "
                             f"of stale_after_s ({heartbeat_s} / {stale_after_s})")
        self.registry = registry
        self.facts = facts
        self.runtime = runtime
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.usage = usage
        self.host_id: str | None = None
        self.epoch: int | None = None
        self.state: State = "starting"
        self._renewed_at = 0.0  # monotonic: when the last heartbeat that was renewed was sent
        self._paused: set[str] = set()  # sandboxes this agent paused for a partition or fence
        self._loop: asyncio.Task[None] | None = None
        self._watch = asyncio.Lock()

    # -- what LeasedHost asks -------------------------------------------------------------

    def check(self) -> tuple[str, int]:
        """This host's id and epoch, if it may serve; HostUnavailable otherwise."""
        if self.state != "serving" or self.host_id is None or self.epoch is None:
            raise HostUnavailable(f"host {self.host_id or self.facts.endpoint} is "
                                  f"{self.state}: it serves again once the registry "
                                  f"confirms its epoch")
        return self.host_id, self.epoch

    def still(self, epoch: int) -> bool:
        """Whether the agent still serves under `epoch` (an operation that began under it
        may keep what it made)."""
        return self.state == "serving" and self.epoch == epoch

    async def lease(self, sandbox_id: str) -> int:
        """Take the sandbox's lease under the current epoch; its epoch. HostUnavailable if
        the agent may not serve, the registry refused (fenced) or cannot be reached."""
        host_id, epoch = self.check()
        try:
            taken = await asyncio.to_thread(self.registry.lease, sandbox_id, host_id, epoch)
        except Exception as exc:  # the database's errors are many drivers' classes
            raise HostUnavailable(f"cannot lease {sandbox_id}: the registry is out of reach "
                                  f"({type(exc).__name__})") from exc
        if not taken:
            raise HostUnavailable(f"host {host_id} is fenced (epoch {epoch} is no longer "
                                  f"its own): {sandbox_id} cannot run here")
        return epoch

    async def release(self, sandbox_id: str) -> None:
        """Drop the sandbox's lease if this host holds it. Best effort: a lease left behind
        for a sandbox that is gone is harmless (any host may take it)."""
        if self.host_id is None:
            return
        try:
            await asyncio.to_thread(self.registry.release, sandbox_id, self.host_id)
        except Exception as exc:
            log.warning("could not release the lease of %s: %s", sandbox_id, exc)

    # -- lifecycle ------------------------------------------------------------------------

    async def join(self) -> Host:
        """Register (the same id as before at this endpoint; a new epoch if the host went
        stale or was fenced), then kill every sandbox whose lease is not this host's at its
        epoch. The registry must be reachable (the caller fails to start otherwise)."""
        host = await asyncio.to_thread(self._register)
        log.info("registered as %s at epoch %d (%s)", host.id, host.epoch, self.facts.endpoint)
        await self._reconcile()
        self.state = "serving"
        return host

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._run(),
                                                                name="registry-heartbeat")

    async def close(self) -> None:
        """Stop heartbeating; leases and VMs stay (the next agent re-adopts them, and keeps
        them if it registers before the host goes stale)."""
        self.state = "closed"
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    # -- the loop -------------------------------------------------------------------------

    @property
    def _tick(self) -> float:
        return min(self.heartbeat_s, self.stale_after_s * (1 - PARTITION_SHARE)) / 4

    async def _run(self) -> None:
        while True:
            sent = time.monotonic()
            try:
                await self._once(sent)
                await self._sleep_until(sent + self.heartbeat_s)
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one failure, or nothing pauses
                log.exception("heartbeat loop")
                await asyncio.sleep(self._tick)

    async def _once(self, sent: float) -> None:
        beat = asyncio.ensure_future(self._beat())
        try:
            while not beat.done():
                await asyncio.wait({beat}, timeout=self._tick)
                await self._watchdog()
            renewed = beat.result()
        except asyncio.CancelledError:
            beat.cancel()
            raise
        except Exception as exc:
            log.warning("heartbeat failed (registry out of reach?): %s", exc)
            return
        if renewed is None:
            await self._fenced()
        else:
            self._renewed_at = sent
            if self.state == "partitioned":
                await self._partition_over()

    async def _beat(self) -> int | None:
        assert self.host_id is not None and self.epoch is not None
        usage = await self.usage() if self.usage is not None else None
        return await asyncio.to_thread(self.registry.heartbeat, self.host_id, self.epoch,
                                       usage)

    async def _sleep_until(self, when: float) -> None:
        while (left := when - time.monotonic()) > 0:
            await asyncio.sleep(min(left, self._tick))
            await self._watchdog()

    async def _watchdog(self) -> None:
        """Past the safe share of the stale window without a renewed heartbeat: pause."""
        if self.state != "serving":
            return
        if time.monotonic() - self._renewed_at <= self.stale_after_s * PARTITION_SHARE:
            return
        self.state = "partitioned"
        log.warning("no heartbeat renewed for %.1f s: pausing every running VM until the "
                    "registry answers", time.monotonic() - self._renewed_at)
        await self._pause_all()

    async def _fenced(self) -> None:
        log.warning("host %s was fenced (epoch %s refused): refusing calls, pausing its VMs "
                    "and registering again", self.host_id, self.epoch)
        self.state = "fenced"
        await self._pause_all()
        while True:
            try:
                host = await asyncio.to_thread(self._register)
                await self._reconcile()
                break
            except Exception as exc:
                log.warning("registering again failed: %s", exc)
                await asyncio.sleep(self.heartbeat_s)
        log.info("registered again as %s at epoch %d: serving", host.id, host.epoch)
        self.state = "serving"

    async def _partition_over(self) -> None:
        try:
            await self._reconcile()
        except Exception as exc:  # still partitioned; the next beat tries again
            log.warning("the registry answered, then not: %s", exc)
            return
        log.info("the registry answers again and epoch %s is still this host's: serving",
                 self.epoch)
        self.state = "serving"

    # -- helpers --------------------------------------------------------------------------

    def _register(self) -> Host:
        sent = time.monotonic()  # the registration renews the heartbeat, as a beat does
        f = self.facts
        host = self.registry.register_host(f.endpoint, vcpus=f.vcpus, memory_mb=f.memory_mb,
                                           disk_mb=f.disk_mb, labels=f.labels,
                                           version=f.version, levels=f.levels,
                                           stale_after_seconds=self.stale_after_s)
        self.host_id, self.epoch = host.id, host.epoch
        self._renewed_at = sent
        return host

    async def _pause_all(self) -> None:
        async with self._watch:
            for sandbox in await self.runtime.list_sandboxes():
                if sandbox.state != "running":
                    continue
                try:
                    await self.runtime.pause(sandbox.id)
                    self._paused.add(sandbox.id)
                except HostError as exc:  # it ended meanwhile, or is mid-hibernation
                    log.warning("could not pause %s: %s", sandbox.id, exc)

    async def _reconcile(self) -> None:
        """Kill every sandbox whose lease is not this host's at its epoch (none at all
        included); resume the ones this agent paused that are still its own."""
        assert self.host_id is not None and self.epoch is not None
        host_id, epoch = self.host_id, self.epoch
        leases = {lease.sandbox_id: lease.epoch
                  for lease in await asyncio.to_thread(self.registry.host_leases, host_id)}
        async with self._watch:
            for sandbox in await self.runtime.list_sandboxes():
                if leases.get(sandbox.id) == epoch:
                    continue
                log.warning("killing %s: its lease is %s, not this host's at epoch %d",
                            sandbox.id, "absent" if sandbox.id not in leases
                            else f"at epoch {leases[sandbox.id]}", epoch)
                try:
                    await self.runtime.kill(sandbox.id)
                except SandboxNotFound:
                    pass
                except HostError:
                    log.exception("could not kill %s", sandbox.id)
                    raise
                self._paused.discard(sandbox.id)
            for sid in sorted(self._paused):
                try:
                    await self.runtime.resume(sid)
                except HostError as exc:
                    log.warning("could not resume %s: %s", sid, exc)
            self._paused.clear()
