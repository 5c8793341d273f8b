"""One page of a team's sandboxes, mixed into `Store`: filtered in the query and paged by
keyset on (created_at, id), so a page boundary never skips or repeats a row however many
sandboxes are created or end meanwhile (an offset would shift). The token names the last row
of the page; it is opaque to clients (ADR 0030)."""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, and_, exists, func, or_, select
from sqlalchemy.orm import Session

from .models import Sandbox


class BadPageToken(ValueError):
    """A next_token this server did not make (the API's 400)."""


@dataclass(frozen=True)
class SandboxFilter:
    state: str | None = None
    exclude_states: Sequence[str] = ()
    template: str | None = None
    started_after: float | None = None
    metadata: Mapping[str, str] | None = None


def page_token(row: Sandbox) -> str:
    raw = json.dumps([row.created_at, row.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _position(token: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_at, sandbox_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise BadPageToken("next_token is not one this server gave") from None
    if (not isinstance(created_at, int | float) or isinstance(created_at, bool)
            or not math.isfinite(created_at) or not isinstance(sandbox_id, str)):
        raise BadPageToken("next_token is not one this server gave")
    return float(created_at), sandbox_id


def _label_is(dialect: str, key: str, value: str) -> ColumnElement[bool]:
    """metadata[key] == value for any key: SQLite's JSON paths cannot spell every key (a
    `"` in one), so there the object's entries are searched instead."""
    if dialect == "sqlite":
        entries = func.json_each(Sandbox.meta).table_valued("key", "value")
        return exists(select(1).select_from(entries).where(entries.c.key == key,
                                                           entries.c.value == value))
    match: ColumnElement[bool] = Sandbox.meta[key].as_string() == value
    return match


class SandboxListing:
    """Mixed into `Store`."""

    if TYPE_CHECKING:
        def session(self) -> AbstractContextManager[Session]: ...

    def page_sandboxes(self, team: str, where: SandboxFilter, *, limit: int | None,
                       after: str | None, newest_first: bool = False
                       ) -> tuple[list[Sandbox], str | None]:
        """Oldest first (`newest_first`: the reverse, E2B's default order); with `limit`, at
        most that many and the token of the next page (None on the last one). `after`: a
        token from a page before, listed in the same order."""
        q = select(Sandbox).where(Sandbox.team == team)
        if where.state is not None:
            q = q.where(Sandbox.state == where.state)
        if where.exclude_states:
            q = q.where(Sandbox.state.not_in(list(where.exclude_states)))
        if where.template is not None:
            q = q.where(Sandbox.template == where.template)
        if where.started_after is not None:
            q = q.where(Sandbox.created_at > where.started_after)
        if after is not None:
            created_at, sandbox_id = _position(after)
            if newest_first:
                q = q.where(or_(Sandbox.created_at < created_at,
                                and_(Sandbox.created_at == created_at,
                                     Sandbox.id < sandbox_id)))
            else:
                q = q.where(or_(Sandbox.created_at > created_at,
                                and_(Sandbox.created_at == created_at,
                                     Sandbox.id > sandbox_id)))
        q = (q.order_by(Sandbox.created_at.desc(), Sandbox.id.desc()) if newest_first
             else q.order_by(Sandbox.created_at, Sandbox.id))
        if limit is not None:
            q = q.limit(limit + 1)  # one more: is there a next page at all?
        with self.session() as s:
            dialect = s.get_bind().dialect.name
            for key, value in (where.metadata or {}).items():
                q = q.where(_label_is(dialect, key, value))
            rows = list(s.scalars(q))
        if limit is None or len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, page_token(rows[-1])
