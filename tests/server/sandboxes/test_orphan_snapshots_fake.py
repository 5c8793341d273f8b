"""A running server removes what a crash left in the snapshot store (files without a row,
past their grace) on its own, not only at its next start: bench/chaos.py's interrupted
snapshots and forks filled a 3 GiB store within minutes while the server kept running."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from sqlalchemy import delete

from pandastack.server.sandboxes.service import SandboxService
from pandastack.server.sandboxes.stopped import (
    ORPHAN_SNAPSHOT_GRACE_SECONDS,
    remove_orphan_snapshots,
)
from pandastack.server.store import Snapshot
from tests.server.conftest import make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.sandboxes.test_api_snapshots_fake import create, post


async def test_orphan_snapshots_past_their_grace_go_while_the_server_runs(
        tmp_path: Path) -> None:
    settings = make_settings(tmp_path, reaper_interval_seconds=3600)
    runtime = FakeRuntime(tmp_path)
    async with running_app(settings, runtime) as api:
        sid = str((await create(api))["id"])
        old, young, kept = [str((await post(api, f"/v1/sandboxes/{sid}/snapshots", 201))["id"])
                            for _ in range(3)]
        service: SandboxService = api.app.state.service
        with service.store.session() as s:  # crashes before their rows were written
            s.execute(delete(Snapshot).where(Snapshot.id.in_([old, young])))
        infos = runtime.snapshots.infos
        infos[old] = dataclasses.replace(
            infos[old], created_at=time.time() - ORPHAN_SNAPSHOT_GRACE_SECONDS - 60)
        await remove_orphan_snapshots(service)
        assert old not in infos
        assert young in infos and kept in infos  # within the grace; has its row
        assert (await api.client.get(f"/v1/snapshots/{kept}")).status_code == 200
