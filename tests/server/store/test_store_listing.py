"""`Store.page_sandboxes` on real SQLite and a real PostgreSQL (the `db` fixture): keyset pages
over (created_at, id) that neither skip nor repeat a row when rows come and go between pages
(also rows sharing one created_at), and the filters done in the query (metadata keys with
awkward characters included), so a page is never short because of them."""

from __future__ import annotations

import pytest

from pandastack.server.store import Sandbox, Store
from pandastack.server.store.listing import BadPageToken, SandboxFilter, page_token

TEAM = "t1"
T0 = 1_700_000_000.25


def add(store: Store, sid: str, created_at: float, *, team: str = TEAM, state: str = "running",
        template: str = "base", meta: dict[str, str] | None = None) -> None:
    store.add_sandbox(Sandbox(
        id=sid, team=team, template=template, state=state, created_at=created_at,
        expires_at=created_at + 60, ttl_seconds=60, persistent=False, vcpus=1, memory_mb=512,
        disk_mb=None, env={}, meta=meta or {}, last_activity_at=created_at, ended_at=None,
        end_reason=None))


def walk(store: Store, where: SandboxFilter, limit: int) -> list[str]:
    ids: list[str] = []
    token: str | None = None
    for _ in range(50):
        rows, token = store.page_sandboxes(TEAM, where, limit=limit, after=token)
        ids += [r.id for r in rows]
        if token is None:
            return ids
    raise AssertionError("the pages never ended")


def test_pages_neither_skip_nor_repeat(store: Store) -> None:
    # Three rows share one created_at: the id breaks the tie.
    for i, sid in enumerate(["sbx-a", "sbx-c", "sbx-b", "sbx-d", "sbx-e"]):
        add(store, sid, T0 + (0 if i < 3 else i))
    add(store, "sbx-other-team", T0, team="t2")
    every = SandboxFilter()
    assert walk(store, every, 2) == ["sbx-a", "sbx-b", "sbx-c", "sbx-d", "sbx-e"]
    rows, token = store.page_sandboxes(TEAM, every, limit=2, after=None)
    assert [r.id for r in rows] == ["sbx-a", "sbx-b"] and token is not None
    # Meanwhile one before the boundary ends and a new one comes: the next page is exact.
    store.update_sandbox("sbx-a", state="killed")
    add(store, "sbx-f", T0 + 10)
    rows, token = store.page_sandboxes(TEAM, every, limit=3, after=token)
    assert [r.id for r in rows] == ["sbx-c", "sbx-d", "sbx-e"] and token is not None
    rows, token = store.page_sandboxes(TEAM, every, limit=3, after=token)
    assert [r.id for r in rows] == ["sbx-f"] and token is None
    assert store.page_sandboxes(TEAM, every, limit=None, after=None)[1] is None
    live = SandboxFilter(exclude_states=("killed",))
    assert walk(store, live, 1) == ["sbx-b", "sbx-c", "sbx-d", "sbx-e", "sbx-f"]


def test_filters_are_in_the_query(store: Store) -> None:
    odd = 'we"ird.key $[0]'
    for i in range(6):
        add(store, f"sbx-{i}", T0 + i, template="base" if i % 2 else "ci",
            meta={"suite": "x" if i < 4 else "y", odd: str(i % 3)})
    assert walk(store, SandboxFilter(metadata={"suite": "x"}), 1) == [
        "sbx-0", "sbx-1", "sbx-2", "sbx-3"]
    assert walk(store, SandboxFilter(metadata={odd: "1"}), 1) == ["sbx-1", "sbx-4"]
    assert walk(store, SandboxFilter(metadata={"suite": "x", odd: "0"}), 1) == [
        "sbx-0", "sbx-3"]
    assert walk(store, SandboxFilter(metadata={"missing": "x"}), 1) == []
    assert walk(store, SandboxFilter(template="ci"), 2) == ["sbx-0", "sbx-2", "sbx-4"]
    assert walk(store, SandboxFilter(started_after=T0 + 3), 2) == ["sbx-4", "sbx-5"]
    rows, token = store.page_sandboxes(TEAM, SandboxFilter(metadata={"suite": "x"}), limit=2,
                                       after=None)
    assert len(rows) == 2 and token is not None  # filtered in SQL: the page is full


@pytest.mark.parametrize("token", ["", "bm9wZQ", "WzEsMl0", "WyJ4IiwieSJd", "!!",
                                   "WzFlOTk5LCJ4Il0"])
def test_a_token_not_made_here_is_refused(store: Store, token: str) -> None:
    with pytest.raises(BadPageToken):
        store.page_sandboxes(TEAM, SandboxFilter(), limit=1, after=token)


def test_a_token_names_a_position_not_a_row(store: Store) -> None:
    add(store, "sbx-1", T0)
    add(store, "sbx-2", T0 + 1)
    rows, _ = store.page_sandboxes(TEAM, SandboxFilter(), limit=None, after=None)
    token = page_token(rows[0])
    store.update_sandbox("sbx-1", state="killed")  # the row the token names may change
    after, _ = store.page_sandboxes(TEAM, SandboxFilter(exclude_states=("killed",)),
                                    limit=5, after=token)
    assert [r.id for r in after] == ["sbx-2"]
