"""The reaper sweeps every `reaper_interval_seconds` but purges (ended rows past retention,
old events) at most every `PURGE_EVERY_SECONDS`: the purge's DELETEs were most of an idle
server's CPU, on the loop beside every request. A retention shorter than that purges on
every sweep (test_api_fake's retention test)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import event

from pandastack.server.sandboxes.lifecycle import PURGE_EVERY_SECONDS, purge_every
from tests.server.conftest import make_settings, running_app
from tests.server.fakes import FakeRuntime

SWEEPS = 5
DEADLINE_POLLS = 2000  # x 0.01 s


async def test_sweeps_purge_once_within_the_purge_interval(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, retention_seconds=3600, reaper_interval_seconds=0.02)
    assert purge_every(settings) == PURGE_EVERY_SECONDS
    seen = {"sweeps": 0, "purges": 0}

    def note(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        words = statement.split()
        if words[:3] == ["DELETE", "FROM", "events"]:
            seen["purges"] += 1
        elif words[:1] == ["SELECT"] and "WHERE sandboxes.state IN" in statement:
            seen["sweeps"] += 1  # each sweep reads the live rows once

    async with running_app(settings, FakeRuntime(tmp_path / "sandboxes")) as api:
        engine = api.app.state.store.engine
        event.listen(engine, "before_cursor_execute", note)
        try:
            start = dict(seen)
            for _ in range(DEADLINE_POLLS):
                if seen["sweeps"] - start["sweeps"] >= SWEEPS:
                    break
                await asyncio.sleep(0.01)
            assert seen["sweeps"] - start["sweeps"] >= SWEEPS, seen
        finally:
            event.remove(engine, "before_cursor_execute", note)
    # the first sweep purges (it may still be under way when the listener comes); none of
    # the next ones does
    assert seen["purges"] <= 1, seen


def test_a_short_retention_purges_on_every_sweep(tmp_path: Path) -> None:
    assert purge_every(make_settings(tmp_path, retention_seconds=0)) == 0
    assert purge_every(make_settings(tmp_path, retention_seconds=30)) == 30
