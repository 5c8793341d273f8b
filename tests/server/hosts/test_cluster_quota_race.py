"""The restore of a lost host's sandboxes under a team's quota (issue 33), over two fake hosts
that share their hibernations, on SQLite and PostgreSQL: four hibernated sandboxes of a lost
host, restored by four parallel wakes under max_sandboxes 2, end with two running on the
live host and two still host_lost. The live host's wake waits until every request reached it
or was answered, so each check runs while the others' restores are under way."""

from __future__ import annotations

from pathlib import Path

from pandastack.server.store import open_store
from tests.server.accounts.test_api_quota_races_fake import Gate, racing, statuses
from tests.server.conftest import make_settings, running_app
from tests.server.hosts.test_cluster import Cluster, age, pool_for


async def test_four_restores_of_a_lost_host_under_max_sandboxes_2(tmp_path: Path,
                                                                  db: str) -> None:
    cluster = Cluster(tmp_path)
    settings = make_settings(tmp_path, cluster=True, db_url=db, reaper_interval_seconds=3600)
    store = open_store(settings.dsn)
    pool = pool_for(store, cluster)
    a = cluster.ids["a"]
    live = cluster.fakes["b"]
    gate = Gate()
    unguarded = live.wake

    async def gated_wake(sandbox_id: str) -> None:
        await gate.passing()
        await unguarded(sandbox_id)

    async with running_app(settings, pool) as api:
        c = api.client
        h = api.headers(await api.new_key("lost"))
        made = [(await c.post("/v1/sandboxes", json={"persistent": True}, headers=h)).json()
                for _ in range(8)]  # spread over both hosts: the four on a are the ones
        on_a = [m["id"] for m in made if m["host_id"] == a]
        assert len(on_a) == 4, made
        for m in made:
            if m["host_id"] != a:
                assert (await c.delete(f"/v1/sandboxes/{m['id']}", headers=h)).is_success
        epoch = store.get_host(a).epoch  # type: ignore[union-attr]
        for sid in on_a:
            r = await c.post(f"/v1/sandboxes/{sid}/hibernate", headers=h)
            assert r.status_code == 200, r.text
            assert store.lease(sid, a, epoch)  # what the agent does at create
        r = await c.put("/v1/teams/lost/quota", json={"max_sandboxes": 2})
        assert r.status_code == 200, r.text
        age(store, a, 60)
        states: list[str] = []
        for _ in range(50):
            await pool.refresh(force=True)
            api.app.state.service.mark_lost_hosts()
            states = [(await c.get(f"/v1/sandboxes/{s}", headers=h)).json()["state"]
                      for s in on_a]
            if states == ["host_lost"] * 4:
                break
        assert states == ["host_lost"] * 4, states

        live.wake = gated_wake  # type: ignore[method-assign]
        answers = await racing(gate, [
            lambda sid=sid: c.post(f"/v1/sandboxes/{sid}/wake", headers=h)  # type: ignore[misc]
            for sid in on_a])
        assert statuses(answers) == [200, 200, 429, 429], [r.text for r in answers]
        states = sorted([(await c.get(f"/v1/sandboxes/{s}", headers=h)).json()["state"]
                         for s in on_a])
        assert states == ["host_lost", "host_lost", "running", "running"]
        assert len(live.sandboxes) == 2
    store.close()
