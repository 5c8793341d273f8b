"""The template build step cache: step key -> the internal snapshot a build took right after
that step (`templatespec.step_key` chains the keys, so a key names a whole prefix of steps).

One small JSON file per key, written to a temporary name and linked into place, so readers
never see half an entry and the first of two concurrent builds of a step wins. The file's
mtime is the entry's last use. An entry only points at a snapshot: the snapshot store owns
the data, and an entry whose snapshot is gone is stale (dropped when met).

One cache directory belongs with one snapshots directory: the ids it records mean nothing in
another.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
TMP_MAX_AGE_S = 3600.0


@dataclass(frozen=True)
class CacheEntry:
    key: str
    # None: the state is the build's base itself (only ENV/USER steps so far, which change
    # nothing inside the guest).
    snapshot_id: str | None
    base: str  # the spec's from_template, for whoever prunes
    created_at: float
    last_used_at: float = 0.0


class StepCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        if not KEY_RE.match(key):
            raise ValueError(f"invalid cache key {key!r}")
        return self.root / f"{key}.json"

    def get(self, key: str) -> CacheEntry | None:
        path = self._path(key)
        try:
            data = json.loads(path.read_text())
            used = path.stat().st_mtime
            entry = CacheEntry(key=key, snapshot_id=data["snapshot_id"], base=data["base"],
                               created_at=float(data["created_at"]), last_used_at=used)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if entry.snapshot_id is not None and not isinstance(entry.snapshot_id, str):
            return None
        return entry

    def put(self, key: str, snapshot_id: str | None, base: str) -> CacheEntry:
        """Record the entry unless another build recorded this key first; returns the entry
        that is recorded now (ours or theirs)."""
        final = self._path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        entry = CacheEntry(key, snapshot_id, base, time.time(), time.time())
        tmp = self.root / f".tmp-{key}-{secrets.token_hex(4)}"
        record = {k: v for k, v in asdict(entry).items() if k not in ("key", "last_used_at")}
        tmp.write_text(json.dumps(record))
        try:
            os.link(tmp, final)
        except FileExistsError:
            theirs = self.get(key)
            if theirs is not None:
                return theirs
            os.replace(tmp, final)  # an unreadable leftover: ours replaces it
        finally:
            tmp.unlink(missing_ok=True)
        return entry

    def touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self._path(key))

    def drop(self, key: str, snapshot_id: str | None = None) -> None:
        """Remove the entry; with `snapshot_id`, only if it still names that snapshot (a
        concurrent build may have replaced a stale entry meanwhile)."""
        if snapshot_id is not None:
            current = self.get(key)
            if current is not None and current.snapshot_id != snapshot_id:
                return
        self._path(key).unlink(missing_ok=True)

    def entries(self) -> list[CacheEntry]:
        found = []
        for path in sorted(self.root.glob("*.json")) if self.root.exists() else []:
            if KEY_RE.match(path.stem):
                entry = self.get(path.stem)
                if entry is not None:
                    found.append(entry)
        return found

    def sweep(self) -> None:
        """Remove temporary files a crashed writer left."""
        now = time.time()
        for path in self.root.glob(".tmp-*") if self.root.exists() else []:
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > TMP_MAX_AGE_S:
                    path.unlink()
