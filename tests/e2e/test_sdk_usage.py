"""Metering and quotas through the SDK against a live `pandastack serve` on real VMs (one
server process for the module, SIGKILLed and started again in the middle of the metering
test): a 2 vCPU / 1 GiB sandbox that runs, pauses, hibernates, wakes and lives through a
server restart is billed for exactly its running and paused time (2 vCPU-s and 1 GiB-s per
second, its 2 GiB disk until it is killed, hibernation included) at the rate card's price;
a team at max_sandboxes 2 is refused its third create and a fork with 429 quota_exceeded,
and creates again after a kill. Races (issue 33): four sandboxes hibernated under
max_sandboxes 2 and woken by four parallel execs: two wake, two are refused and stay
hibernated with their files; two parallel hibernates with room for one more under
max_hibernated: one hibernates."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pandastack.sdk import Client, QuotaExceededError, UsageRow
from tests.e2e.test_server_restart import ServeProcess, started_serve

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

VCPU_RATE, MEMORY_RATE, DISK_RATE = 0.000015, 0.0000045, 0.00000004


@pytest.fixture(scope="module")
def serve() -> Iterator[ServeProcess]:
    with started_serve("psu-") as server:
        yield server


class Clock:
    """The client's wall clock around each call (the server writes each state with its
    own time, on the same machine)."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[float, float]] = {}

    def call(self, name: str, fn: Callable[[], object]) -> None:
        before = time.time()
        fn()
        self.marks[name] = (before, time.time())


def row_of(client: Client, sandbox_id: str) -> UsageRow:
    rows = [r for r in client.usage(group_by="sandbox").rows if r.sandbox_id == sandbox_id]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_sandbox_is_billed_for_running_and_paused_time_across_a_restart(
        serve: ServeProcess) -> None:
    clock = Clock()
    with Client(serve.url, serve.api_key(), timeout=120) as client:
        # The first create of this shape may bake its template: the SDK waits for it.
        sbx = client.sandboxes.create(vcpus=2, memory_mb=1024, persistent=True,
                                      ttl_seconds=900)
        created = time.time()  # the row became running just before the answer
        try:
            time.sleep(3)
            clock.call("pause", sbx.pause)
            time.sleep(3)  # paused: its memory and vCPUs are still held
            clock.call("resume", sbx.resume)
            time.sleep(1)
            clock.call("hibernate", sbx.hibernate)
            time.sleep(4)  # hibernated: only its disk is held
            clock.call("wake", sbx.wake)
            time.sleep(1)
            mid = row_of(client, sbx.id)  # an open segment counts up to now
            assert mid.vcpu_seconds > 0 and mid.disk_gib_seconds > mid.vcpu_seconds
        except BaseException:
            sbx.kill()
            raise
    serve.signal(signal.SIGKILL)  # no shutdown code runs: the VM keeps going
    time.sleep(1)
    serve.start()  # same DB and state dir: the sandbox is adopted, its segment still open
    with Client(serve.url, serve.api_key(), timeout=120) as client:
        sbx = client.sandboxes.connect(sbx.id)
        assert sbx.info.state == "running"
        time.sleep(1)
        killed_at = time.time()  # the row is ended before its VM is killed
        sbx.kill()
        row = row_of(client, sbx.id)
        assert row_of(client, sbx.id) == row  # ended: it does not grow any more
    # Compute is held from create to hibernate and from wake to kill (pause included);
    # each state is written at the end of its transition (the end's first, as it starts).
    held = (clock.marks["hibernate"][1] - created) + (killed_at - clock.marks["wake"][1])
    slack = sum(after - before for before, after in clock.marks.values())
    assert held > 9
    assert abs(row.vcpu_seconds - 2 * held) <= 0.1 * 2 * held, (row, held)
    assert abs(row.memory_gib_seconds - held) <= 0.1 * held, (row, held)
    # within the time each change took (a transition writes the state as it ends)
    assert held - slack - 1 <= row.memory_gib_seconds <= held + slack + 1, (row, held, slack)
    disk = killed_at - created
    assert abs(row.disk_gib_seconds - 2 * disk) <= 0.1 * 2 * disk, (row, disk)
    assert row.disk_gib_seconds > 2 * (held + 3)  # hibernated time holds the disk only
    # The server rounds a cost to 9 decimals (server/accounts/metering.py): up to half of 1e-9 off.
    assert row.cost_usd == pytest.approx(row.vcpu_seconds * VCPU_RATE
                                         + row.memory_gib_seconds * MEMORY_RATE
                                         + row.disk_gib_seconds * DISK_RATE, abs=1e-9)


def test_a_team_at_max_sandboxes_2(serve: ServeProcess) -> None:
    with Client(serve.url, serve.api_key(), timeout=120) as admin:
        key = admin.keys.create("quota", team="capped").key
        info = admin.teams.set_quota("capped", max_sandboxes=2)
        assert info.max_sandboxes == 2
    with Client(serve.url, key, timeout=120) as team:
        first = team.sandboxes.create(ttl_seconds=300)
        second = team.sandboxes.create(ttl_seconds=300)
        made = [first, second]
        try:
            with pytest.raises(QuotaExceededError) as exc:
                team.sandboxes.create(ttl_seconds=300)
            assert (exc.value.status, exc.value.code) == (429, "quota_exceeded")
            assert (exc.value.limit, exc.value.value, exc.value.current) == (
                "max_sandboxes", 2, 2)
            with pytest.raises(QuotaExceededError):
                first.fork()
            live = team.sandboxes.list()
            assert sorted(s.id for s in live) == sorted(s.id for s in made)  # nothing half-made
            second.kill()
            made.append(team.sandboxes.create(ttl_seconds=300))  # room again
            assert made[-1].exec("echo ok").stdout == "ok\n"
        finally:
            for sbx in made:
                sbx.kill()
        assert team.sandboxes.list() == []


def racing(url: str, key: str, ids: list[str],
           call: Callable[[object], object]) -> list[BaseException | None]:
    """`call` on each sandbox at once (a client each, released together): None where it
    passed, else what it raised."""
    start = threading.Barrier(len(ids))

    def one(sid: str) -> BaseException | None:
        with Client(url, key, timeout=300) as client:
            sbx = client.sandboxes.connect(sid)
            start.wait(timeout=120)
            try:
                call(sbx)
            except Exception as exc:  # the caller looks at each
                return exc
            return None

    with ThreadPoolExecutor(len(ids)) as pool:
        return list(pool.map(one, ids))


def refused(outcomes: list[BaseException | None], limit: str) -> list[int]:
    """The indexes refused for `limit`; anything else raised fails the test."""
    out = []
    for i, exc in enumerate(outcomes):
        if exc is None:
            continue
        if not isinstance(exc, QuotaExceededError):
            raise exc
        assert (exc.status, exc.code, exc.limit) == (429, "quota_exceeded", limit), exc
        out.append(i)
    return out


def test_racing_wakes_and_hibernates_stay_within_the_team_quota(serve: ServeProcess) -> None:
    with Client(serve.url, serve.api_key(), timeout=120) as admin:
        key = admin.keys.create("race", team="racing").key
        admin.teams.set_quota("racing", max_sandboxes=2)
    with Client(serve.url, key, timeout=300) as team:
        made = []
        try:
            for _ in range(2):  # two, hibernated, two more, hibernated: four under a quota of 2
                pair = [team.sandboxes.create(ttl_seconds=900, persistent=True)
                        for _ in range(2)]
                made += pair
                for sbx in pair:
                    sbx.files.write("/tmp/mark", sbx.id)
                    sbx.hibernate()
            ids = [s.id for s in made]
            outcomes = racing(serve.url, key, ids,
                              lambda sbx: sbx.exec("cat /tmp/mark"))  # type: ignore[attr-defined]
            out = refused(outcomes, "max_sandboxes")
            assert len(out) == 2, outcomes
            states = [team.sandboxes.connect(sid).info.state for sid in ids]
            assert [states[i] for i in out] == ["hibernated", "hibernated"], states
            assert sorted(states) == ["hibernated", "hibernated", "running", "running"]
            running = [sid for sid, st in zip(ids, states, strict=True) if st == "running"]
            # Room for one more hibernated sandbox: of two racing hibernates, one passes.
            with Client(serve.url, serve.api_key(), timeout=120) as admin:
                admin.teams.set_quota("racing", max_hibernated=3)
            outcomes = racing(serve.url, key, running,
                              lambda sbx: sbx.hibernate())  # type: ignore[attr-defined]
            assert len(refused(outcomes, "max_hibernated")) == 1, outcomes
            states = [team.sandboxes.connect(sid).info.state for sid in ids]
            assert sorted(states) == ["hibernated"] * 3 + ["running"], states
            with Client(serve.url, serve.api_key(), timeout=120) as admin:
                use = admin.teams.get_quota("racing").usage
            assert (use.sandboxes, use.hibernated) == (1, 3), use
            # The refused wakes lost nothing: with room again, each wakes with its file.
            for sid, st in zip(ids, states, strict=True):
                if st == "running":
                    team.sandboxes.connect(sid).kill()
            for i in out:
                woken = team.sandboxes.connect(ids[i])
                assert woken.exec("cat /tmp/mark").stdout == ids[i]
                woken.kill()
        finally:
            for sbx in made:
                sbx.kill()
