"""File names that are not UTF-8, listed and watched through raw frames: the reference agent
carries each byte that is not UTF-8 as a lone surrogate (Python's surrogateescape), so the
binary agent must send the same JSON, and both must agree with what the kernel has."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)

NAMES = [b"caf\xe9", b"ok-\xc3\xa9", b"\xff\xfe", b"plain"]


@pytest.fixture
def raw(agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw(cmd=agent_cmd)
    r.hello()
    yield r
    r.close()


def test_listing_escapes_names_as_the_reference(raw: Raw, tmp_path: Path) -> None:
    for name in NAMES:
        open(bytes(tmp_path) + b"/" + name, "wb").close()
    raw.req("list", 1, path=str(tmp_path))
    frames = raw.recv_until(1, "entries")
    entries: list[dict[str, Any]] = json.loads(frames[-1].payload)
    got = sorted(e["name"] for e in entries)
    assert got == sorted(os.fsdecode(n) for n in NAMES)
    for e in entries:
        assert os.fsencode(e["path"]) == bytes(tmp_path) + b"/" + os.fsencode(e["name"])
        assert e["type"] == "file" and e["size"] == 0


def test_watch_events_escape_names_as_the_reference(raw: Raw, tmp_path: Path) -> None:
    raw.req("watch", 1, path=str(tmp_path))
    assert raw.recv_until(1, "watching")[-1].t == "watching"
    open(bytes(tmp_path) + b"/\xe9t\xe9", "wb").close()
    events: list[dict[str, Any]] = []
    while not any(e["type"] == "create" for e in events):
        f = raw.recv()
        if f.id == 1 and f.t == "events":
            events += json.loads(f.payload)
    created = [e for e in events if e["type"] == "create"]
    assert os.fsencode(created[0]["path"]) == bytes(tmp_path) + b"/\xe9t\xe9"
    raw.req("cancel", 1)
