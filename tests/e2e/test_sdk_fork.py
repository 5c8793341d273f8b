"""Fork, snapshots and hibernation through the public SDK against a live server (real VMs):
fork two children that each run a command; snapshot -> create from it; hibernate -> a command
wakes it. Events and webhooks: create, fork and kill seen in order on the event stream and
delivered, signed, to a webhook on a loopback receiver."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pandastack import Client, ConflictError, NotFoundError, Sandbox
from pandastack.webhooks import verify_signature
from tests.e2e.conftest import LiveServer
from tests.sdk_credentials import Credentials
from tests.server.webhook_receiver import receiver

pytestmark = [pytest.mark.vm, pytest.mark.e2e]


def test_fork_snapshot_hibernate(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    with Sandbox.create(ttl_seconds=300, **creds) as parent:
        parent.filesystem.write("/work/state.txt", "before the fork")
        children = parent.fork(count=2)
        try:
            assert len({c.id for c in children} | {parent.id}) == 3
            for n, child in enumerate(children):
                run = child.exec(f"cat /work/state.txt; echo child-{n} > /work/mine.txt")
                assert run.exit_code == 0 and run.stdout == "before the fork", run
            assert parent.exec("test -e /work/mine.txt").exit_code == 1
        finally:
            for child in children:
                child.kill()
                child.close()

        snapshot_id = parent.snapshot(name="e2e")
        with Client(**creds) as client:
            assert client.snapshots.get(snapshot_id).source_sandbox == parent.id
            with Sandbox.create(snapshot=snapshot_id, ttl_seconds=300, **creds) as restored:
                assert restored.info.snapshot == snapshot_id
                assert restored.filesystem.read("/work/state.txt") == b"before the fork"
                client.snapshots.delete(snapshot_id)  # its sandbox keeps running
                assert restored.exec("echo alive").stdout == "alive\n"
            with pytest.raises(NotFoundError):
                client.snapshots.get(snapshot_id)

        assert parent.hibernate().state == "hibernated"
        assert parent.refresh().state == "hibernated"
        assert parent.exec("cat /work/state.txt").stdout == "before the fork"  # wakes it
        assert parent.refresh().state == "running"
        parent.hibernate()
        assert parent.wake().state == "running"
        parent_id = parent.id
    with Client(**creds) as client, pytest.raises(ConflictError):
        client.sandboxes.connect(parent_id).fork()


def test_events_and_webhook_of_a_fork(live_server: LiveServer) -> None:
    creds: Credentials = {"api_url": live_server.api_url, "api_key": live_server.api_key}
    wanted = ["sandbox.created", "sandbox.forked", "sandbox.killed"]
    with receiver() as r, Client(**creds) as client:
        hook = client.webhooks.create(r.url, wanted)
        try:
            with client.events.stream(types=wanted) as stream:
                sbx = client.sandboxes.create(ttl_seconds=300)
                [child] = sbx.fork(1)
                child.kill()
                sbx.kill()
                got = []
                for e in stream:  # bounded: four events are written before the loop
                    got.append(e)
                    if len(got) == 4:
                        break
            assert [(e.type, e.sandbox_id) for e in got] == [
                ("sandbox.created", sbx.id), ("sandbox.forked", sbx.id),
                ("sandbox.killed", child.id), ("sandbox.killed", sbx.id)]
            assert got[1].model_extra is not None
            assert got[1].model_extra["children"] == [child.id]
            # The webhook numbers events by the team; an admin key's stream gives the log's
            # global id and the team's number as `seq` (ci5: once another team's events were
            # in the shared server's log the two differed by their count).
            ours = {int((e.model_extra or {}).get("seq", e.id)) for e in got}

            def bodies() -> list[dict[str, Any]]:
                return [verify_signature(hook.secret, d.headers, d.body) for d in r.got]

            deadline = time.monotonic() + 60
            while not ours <= {b["id"] for b in bodies()}:
                assert time.monotonic() < deadline, (sorted(ours), bodies())
                r.wait_for(len(r.got) + 1, timeout=1)
            mine = [b for b in bodies() if b["id"] in ours]
            # Deliveries run concurrently: their order is not the log's, their ids are.
            assert sorted(b["id"] for b in mine) == sorted(ours)
            assert {b["sandbox_id"] for b in mine} == {sbx.id, child.id}
        finally:
            client.webhooks.delete(hook.id)
