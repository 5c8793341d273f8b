"""Pages of a team's snapshots for E2B's `GET /snapshots` (`nextToken` in, `X-Next-Token`
out). The token is the last id of a page: snapshots are listed oldest first by (created_at,
id), so one taken or deleted meanwhile never shifts a page."""

from __future__ import annotations

from collections.abc import Sequence

from pandastack.server.store import Snapshot

from ..errors import E2bError


def snapshot_page(rows: Sequence[Snapshot], limit: int, after: str | None
                  ) -> tuple[list[Snapshot], str | None]:
    ordered = sorted(rows, key=lambda r: (r.created_at, r.id))
    if after is not None:
        last = next((r for r in ordered if r.id == after), None)
        if last is None:
            raise E2bError(400, "nextToken: not one this server gave, or its snapshot is gone")
        ordered = [r for r in ordered if (r.created_at, r.id) > (last.created_at, last.id)]
    page = ordered[:limit]
    return page, page[-1].id if len(ordered) > limit else None
