"""A cluster without VMs: a `ClusterPool` over the real SQLite store's host registry, whose two
registered hosts are in-memory `FakeRuntime`s (their endpoints are names `connect` looks up,
never dialled). Nothing heartbeats: the pool's stale window is an hour, so a host goes `lost`
only when a test moves its heartbeat back in the database (`age`), never by the test's own
slowness. By default there is no grace after the start (`loss_grace_s`): a stale host is
lost at the next read.

`python -m tests.server.fake_cluster PORT DIR [SETTINGS_JSON]` serves the app over it on a real
uvicorn at 127.0.0.1:PORT (for tests/server/live.fake_server), its DB and client config under
DIR."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from pandastack.server.hosts.cluster import ClusterPool
from pandastack.server.settings import Settings
from pandastack.server.store import Store, open_store
from tests.server.conftest import make_settings
from tests.server.fakes import FakeRuntime

ENDPOINTS = ("fake://host-a", "fake://host-b")
CAPACITY: dict[str, Any] = {"vcpus": 8, "memory_mb": 16384, "disk_mb": 100_000}
STALE_AFTER_S = 3600.0


@dataclass
class FakeCluster:
    store: Store
    pool: ClusterPool
    fakes: dict[str, FakeRuntime]  # endpoint -> its host
    host_ids: dict[str, str]  # endpoint -> the id the registry gave it


@contextmanager
def fake_cluster(settings: Settings, tmp: Path, *,
                 loss_grace_s: float = 0) -> Iterator[FakeCluster]:
    store = open_store(settings.dsn)
    try:
        fakes = {e: FakeRuntime(tmp / f"host-{i}") for i, e in enumerate(ENDPOINTS)}
        host_ids = {e: store.register_host(e, **CAPACITY, version="test").id for e in ENDPOINTS}
        pool = ClusterPool(store, lambda endpoint: fakes[endpoint], stale_after_s=STALE_AFTER_S,
                           loss_grace_s=loss_grace_s)
        yield FakeCluster(store, pool, fakes, host_ids)
    finally:
        store.close()


def age(store: Store, host_id: str, seconds: float) -> None:
    """Move the host's last heartbeat `seconds` into the past."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE hosts SET last_heartbeat_at = last_heartbeat_at - :s "
                          "WHERE id = :id"), {"s": seconds, "id": host_id})


def main(argv: list[str]) -> int:
    import uvicorn

    from pandastack.server.app import create_app

    port, tmp = int(argv[0]), Path(argv[1])
    overrides: dict[str, object] = json.loads(argv[2]) if len(argv) > 2 else {}
    settings = make_settings(tmp, port=port, **overrides)
    with fake_cluster(settings, tmp) as cluster:
        app = create_app(settings, cluster.pool)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
