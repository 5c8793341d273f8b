"""The host registry and sandbox leases, on the database's clock (clock.py).

A host is known by its endpoint (what API servers dial): an agent that registers again keeps
its id. A lease names the host that runs a sandbox and the host's epoch when it took it; it is
good while that is still the host's epoch and the host heartbeats. `fence` moves a stale host
and its leases to a new epoch: the agent, which only knows the epoch its registration gave it,
has its heartbeats refused, and registering again gives it yet another epoch, under which the
fenced leases are not its own: it kills their VMs before it serves anything, so a sandbox never
runs on two hosts at once. Each check of an epoch and the write it guards are one transaction,
with the host's row locked (heartbeat, fence) or share-locked (lease), so a fence cannot slip
between them.

`HostRegistry` is mixed into the server's `Store`; `Registry(engine)` is the same queries on
their own, for the agent (which has no other table to use)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from pandastack.hostport.compat import OURS, Levels

from .clock import db_now
from .models import Host, Lease

#: When a host that stopped heartbeating counts as gone, unless the caller says otherwise.
STALE_AFTER_SECONDS = 15.0


@dataclass(frozen=True)
class Usage:
    """What an agent reports at each heartbeat: the templates it holds (by name), how many
    sandboxes it has (hibernated ones included) and the vCPUs and memory its VMs use."""

    templates: tuple[str, ...] = field(default=())
    sandboxes: int = 0
    used_vcpus: int = 0
    used_memory_mb: int = 0

    def values(self) -> dict[str, Any]:
        return {"templates": sorted(set(self.templates)), "sandboxes": self.sandboxes,
                "used_vcpus": self.used_vcpus, "used_memory_mb": self.used_memory_mb}


def new_host_id() -> str:
    return "host-" + secrets.token_hex(6)


def _insert(s: Session, model: type[Host] | type[Lease]) -> Any:
    """INSERT with ON CONFLICT (both dialects have it, under their own constructs)."""
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model)
    if dialect == "sqlite":
        return sqlite.insert(model)
    raise NotImplementedError(f"no upsert for {dialect}")


class HostRegistry:
    """Mixed into `Store`: host and lease queries."""

    if TYPE_CHECKING:
        def session(self) -> AbstractContextManager[Session]: ...

    def db_time(self) -> float:
        """The database's clock, UNIX seconds."""
        with self.session() as s:
            return _now(s)

    # -- hosts ----------------------------------------------------------------------------

    def register_host(self, endpoint: str, *, vcpus: int, memory_mb: int, disk_mb: int,
                      labels: dict[str, str] | None = None, version: str = "",
                      levels: Levels = OURS,
                      stale_after_seconds: float = STALE_AFTER_SECONDS) -> Host:
        """Add the host at `endpoint`, or refresh the one that registered there before (same
        id; capacity, labels, version and protocol `levels` replaced; heartbeat renewed).
        One that had gone stale, or was fenced since its agent last registered, comes back
        under a new epoch, past any it was fenced at; its leases stay under the older one:
        the VMs it ran for them are not its own any more (it kills them), and they are not
        renewed by its heartbeats. A live one that was never fenced keeps its epoch, and with
        it its leases (an agent that restarts quickly keeps its sandboxes)."""
        with self.session() as s:
            now = _now(s)
            s.execute(_insert(s, Host).values(
                id=new_host_id(), endpoint=endpoint, vcpus=vcpus, memory_mb=memory_mb,
                disk_mb=disk_mb, labels=labels or {}, version=version, epoch=1,
                last_heartbeat_at=now, draining=False, created_at=now, templates=[],
                sandboxes=0, used_vcpus=0, used_memory_mb=0, fenced=False,
                protocol=levels.level, oldest_protocol=levels.oldest,
            ).on_conflict_do_nothing(index_elements=["endpoint"]))
            host = s.scalars(select(Host).where(Host.endpoint == endpoint)
                             .with_for_update()).one()
            # A fence of a live host (an operator's) leaves its heartbeat fresh: without the
            # flag, an agent that registers soon after would take the fenced epoch, under
            # which the fenced leases look like its own.
            if host.fenced or host.last_heartbeat_at < now - stale_after_seconds:
                host.epoch += 1
            host.fenced = False
            host.vcpus, host.memory_mb, host.disk_mb = vcpus, memory_mb, disk_mb
            host.labels = labels or {}
            host.version = version
            host.protocol, host.oldest_protocol = levels.level, levels.oldest
            host.last_heartbeat_at = now
            return host

    def heartbeat(self, host_id: str, epoch: int, usage: Usage | None = None) -> int | None:
        """Renew the host and every lease it holds under `epoch` (one statement each), and
        record its `usage` in the host's UPDATE; the number of leases renewed, or None if
        the host is not at `epoch` (fenced, or unknown): then it must stop serving and
        register again."""
        values: dict[str, Any] = {"last_heartbeat_at": db_now()}
        if usage is not None:
            values.update(usage.values())
        with self.session() as s:
            renewed = s.execute(update(Host).where(Host.id == host_id, Host.epoch == epoch)
                                .values(**values))
            if not _rowcount(renewed):
                return None
            return _rowcount(s.execute(update(Lease).where(Lease.host_id == host_id,
                                                          Lease.epoch == epoch)
                                       .values(renewed_at=db_now())))

    def stale_hosts(self, older_than_seconds: float) -> list[Host]:
        """Hosts whose last heartbeat is older than `older_than_seconds` by the database."""
        with self.session() as s:
            return list(s.scalars(
                select(Host).where(Host.last_heartbeat_at < db_now() - older_than_seconds)
                .order_by(Host.last_heartbeat_at)))

    def fence(self, host_id: str, *, epoch: int | None = None,
              older_than_seconds: float | None = None) -> int | None:
        """Move the host and its leases to a new epoch; returns it. With `epoch`, only if the
        host is still at it, and with `older_than_seconds`, only if it is still that stale
        (so that API servers racing to fence one host fence it once, and never one that
        heartbeat since they looked); None when nothing was fenced."""
        q = update(Host).where(Host.id == host_id)
        if epoch is not None:
            q = q.where(Host.epoch == epoch)
        if older_than_seconds is not None:
            q = q.where(Host.last_heartbeat_at < db_now() - older_than_seconds)
        with self.session() as s:
            new: int | None = s.scalar(q.values(epoch=Host.epoch + 1, fenced=True)
                                       .returning(Host.epoch))
            if new is not None:
                s.execute(update(Lease).where(Lease.host_id == host_id).values(epoch=new))
            return new

    def get_host(self, host_id: str) -> Host | None:
        with self.session() as s:
            return s.get(Host, host_id)

    def list_hosts(self) -> list[Host]:
        with self.session() as s:
            return list(s.scalars(select(Host).order_by(Host.created_at, Host.id)))

    def set_draining(self, host_id: str, draining: bool) -> Host | None:
        with self.session() as s:
            host = s.get(Host, host_id)
            if host is not None:
                host.draining = draining
            return host

    # -- leases ---------------------------------------------------------------------------

    def lease(self, sandbox_id: str, host_id: str, epoch: int) -> bool:
        """Give the sandbox's lease to the host under `epoch` (taking it from any other
        holder); False, and nothing changes, if the host is not at `epoch`."""
        with self.session() as s:
            # FOR SHARE: a fence of this host waits for this lease, then moves it too.
            held = s.scalar(select(Host.id).where(Host.id == host_id, Host.epoch == epoch)
                            .with_for_update(read=True))
            if held is None:
                return False
            s.execute(_insert(s, Lease).values(
                sandbox_id=sandbox_id, host_id=host_id, epoch=epoch, renewed_at=db_now(),
            ).on_conflict_do_update(index_elements=["sandbox_id"], set_={
                "host_id": host_id, "epoch": epoch, "renewed_at": db_now()}))
            return True

    def lease_of(self, sandbox_id: str) -> Lease | None:
        with self.session() as s:
            return s.get(Lease, sandbox_id)

    def host_leases(self, host_id: str) -> list[Lease]:
        """Every lease the host holds, under any epoch: what a host that comes back checks
        its VMs against."""
        with self.session() as s:
            return list(s.scalars(select(Lease).where(Lease.host_id == host_id)
                                  .order_by(Lease.sandbox_id)))

    def release(self, sandbox_id: str, host_id: str | None = None) -> bool:
        """Drop the sandbox's lease (with `host_id`: only if that host holds it, so a late
        release by a former holder leaves the new holder's); whether one was dropped."""
        q = delete(Lease).where(Lease.sandbox_id == sandbox_id)
        if host_id is not None:
            q = q.where(Lease.host_id == host_id)
        with self.session() as s:
            return _rowcount(s.execute(q)) > 0


class Registry(HostRegistry):
    """The registry's queries over an engine whose schema is migrated (the server's
    migrations make these tables; the agent runs them before it builds this)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions.begin() as s:
            yield s

    def close(self) -> None:
        self.engine.dispose()


def _now(s: Session) -> float:
    now = s.scalar(db_now().select())
    assert now is not None
    return float(now)


def _rowcount(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
