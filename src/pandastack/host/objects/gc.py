"""Garbage collection of the object store: objects (chunks, or whole files of format 1
manifests) that no manifest names any more are deleted once they are older than a grace
period (ADR 0016).

Mark: every manifest is read and the keys it names collected (each chunk of a format 2 file
reference, the key of a format 1 one). Sweep: every object whose key is not among them and
that was written more than `grace_s` ago is deleted. A manifest that cannot be read or parsed
stops the collection before anything is deleted: deleting on partial knowledge loses data.

The grace period covers publishes under way (their chunks are written before their
manifest). It does not cover a publish that skips a chunk because it was known to be in the
store (objects/chunks.py: uploaded or seen before by that process) while the collector
deletes it: so the sweep reads the manifests a second time just before it deletes and keeps
whatever they name then, and the collector should run where no publish is under way, or with
the hosts' known keys younger than the grace period (a restarted agent knows none).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pandastack.hostport.errors import ObjectStoreError

if TYPE_CHECKING:
    from pandastack.host.objects.store import ObjectStore

_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass
class GarbageReport:
    manifests: int = 0
    referenced: int = 0  # distinct keys the manifests name
    kept_young: int = 0  # unreferenced, but younger than the grace period
    deleted: list[str] = field(default_factory=list)


def referenced_keys(document: Any) -> set[str]:
    """The object keys a manifest names: chunks of chunked files, keys of whole files."""
    found: set[str] = set()
    if isinstance(document, dict):
        chunks = document.get("chunks")
        if isinstance(chunks, list) and "chunk_size" in document:
            found.update(k for k in chunks if isinstance(k, str) and _KEY.fullmatch(k))
        elif "size" in document and isinstance(document.get("key"), str) and \
                _KEY.fullmatch(document["key"]):
            found.add(document["key"])  # format 1: the file is one object
        for value in document.values():
            found |= referenced_keys(value)
    elif isinstance(document, list):
        for value in document:
            found |= referenced_keys(value)
    return found


async def _mark(store: ObjectStore) -> tuple[int, set[str]]:
    names = await store.list_manifests()
    keys: set[str] = set()
    for name in names:
        raw = await store.get_manifest(name)
        if raw is None:
            continue  # deleted since the listing: it names nothing any more
        try:
            keys |= referenced_keys(json.loads(raw))
        except ValueError as exc:
            raise ObjectStoreError(f"manifest {name} cannot be read ({exc}): no garbage is "
                                   "collected on partial knowledge") from None
    return len(names), keys


async def collect_garbage(store: ObjectStore, grace_s: float = 86400.0,
                          now: float | None = None) -> GarbageReport:
    """Deletes the store's objects that no manifest names and that are older than
    `grace_s` seconds; what it found and did."""
    report = GarbageReport()
    report.manifests, referenced = await _mark(store)
    now = time.time() if now is None else now
    candidates: list[str] = []
    after: str | None = None
    while True:
        page, after = await asyncio.to_thread(store.bucket.list_page_with_times, after)
        for key, written in page:
            if key in referenced:
                continue
            if written > now - grace_s:
                report.kept_young += 1
            else:
                candidates.append(key)
        if after is None:
            break
    if candidates:
        _, again = await _mark(store)  # what a manifest written meanwhile names stays
        referenced |= again
    report.referenced = len(referenced)
    for key in candidates:
        if key not in referenced:
            await store.delete(key)
            report.deleted.append(key)
    return report
