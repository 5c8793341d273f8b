"""Counts of guest channel failures in this process, by kind: "timeout" (no answer or no
room to write in time), "closed" (the guest's end went away), "protocol" (an invalid frame),
"reconnect" (a broken channel replaced by a new connection).

Plain counts, so that counting costs nothing on the hot path; the agent's /metrics reads
them when scraped (one agent process serves one host)."""

from __future__ import annotations

from collections import Counter

CHANNEL_FAILURES: Counter[str] = Counter()


def note_failure(kind: str) -> None:
    CHANNEL_FAILURES[kind] += 1
