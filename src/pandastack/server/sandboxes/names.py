"""Sandboxes by name (issue 21, item 5): a team's name for a sandbox ("user-42"), unique
among its sandboxes that have not ended, so an agent can address "this user's workspace"
without keeping ids.

- `POST /v1/sandboxes {"name": ...}` makes one: 409 `conflict` if a live sandbox of the team
  has that name. The check runs in the transaction that inserts the row, under the team's
  lock (store/usage.py `admit`), and a partial unique index holds the same line.
- `PUT /v1/sandboxes/by-name/{name}` (`Sandbox.get_or_create`) answers the live one of that
  name (a hibernated one woken first; a paused or starting one as it is once it has started),
  or makes one with the body's options: 200 or 201. Concurrent calls with one name get one
  sandbox: the losers of the insert wait for the winner's (bounded) and answer it.
- An ended sandbox frees its name: the next get_or_create makes a new sandbox under it (with
  a new id; nothing of the old one comes back but through its snapshots or volumes).
- A name never looks like a sandbox id (`sbx-...`), so `GET /v1/sandboxes/{id}` and
  `Sandbox.connect(...)` take either.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..store import Sandbox
from ..store.usage import QuotaCheck
from ..web.errors import ApiError, not_found

if TYPE_CHECKING:
    from pandastack.wire.sandboxes import CreateSandbox

    from .parts import ServiceParts

#: How long a get_or_create that lost the race waits for the winner's sandbox to start.
WAIT_FOR_WINNER_S = 300.0
ATTEMPTS = 3


class NameTaken(ApiError):
    """409: a live sandbox of the team has the name (`sandbox_id`)."""

    def __init__(self, name: str, sandbox_id: str) -> None:
        super().__init__(409, "conflict", f"the team has a live sandbox named {name!r} "
                         f"({sandbox_id}); Sandbox.get_or_create reuses it")
        self.sandbox_id = sandbox_id


def claiming(check: QuotaCheck | None, name: str) -> QuotaCheck:
    """`check`, then the name's: run in the transaction that inserts the row."""
    def run(s: Session, team: str) -> None:
        if check is not None:
            check(s, team)
        holder = s.scalar(select(Sandbox.id).where(Sandbox.team == team, Sandbox.name == name,
                                                   Sandbox.ended_at.is_(None)))
        if holder is not None:
            raise NameTaken(name, holder)
    return run


class SandboxNames:
    def __init__(self, service: ServiceParts) -> None:
        self.service = service

    def live(self, team: str, name: str) -> Sandbox | None:
        with self.service.store.session() as s:
            return s.scalars(select(Sandbox).where(Sandbox.team == team, Sandbox.name == name,
                                                   Sandbox.ended_at.is_(None))).first()

    def row(self, team: str, name: str) -> Sandbox:
        row = self.live(team, name)
        if row is None:
            raise not_found(f"sandbox named {name!r}")
        return row

    async def get_or_create(self, team: str, name: str,
                            req: CreateSandbox) -> tuple[Sandbox, bool]:
        """(the sandbox, whether it was made now)."""
        made_req = req.model_copy(update={"name": name})
        for _ in range(ATTEMPTS):
            row = self.live(team, name)
            if row is None:
                try:
                    return await self.service.create(team, made_req), True
                except NameTaken:
                    continue  # another call made it meanwhile: answer that one
            ready = await self._started(team, row)
            if ready is None:
                continue  # it failed or ended meanwhile: the name is free again
            if ready.state == "hibernated":
                ready = await self.service.wake_row(ready)
            return ready, False
        raise ApiError(503, "unavailable", f"sandbox {name!r} kept ending while it was being "
                       "made; retry", headers={"Retry-After": "1"})

    async def _started(self, team: str, row: Sandbox) -> Sandbox | None:
        """The row once it is no longer starting (None if it ended), bounded."""
        deadline = time.monotonic() + WAIT_FOR_WINNER_S
        current: Any = row
        while current is not None and current.state == "starting":
            if time.monotonic() > deadline:
                raise ApiError(503, "unavailable", f"sandbox {row.id} is still starting",
                               headers={"Retry-After": "5"})
            await asyncio.sleep(0.05)
            current = self.service.store.get_sandbox(team, row.id)
        if current is None or current.ended_at is not None:
            return None
        return current  # type: ignore[no-any-return]
