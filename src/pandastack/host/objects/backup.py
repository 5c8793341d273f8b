"""A copy of the object store in a directory, and back (`pandastack backup objects`,
`pandastack restore objects`; docs/backup.md).

The store holds two kinds of keys (s3.py): content objects under `sha256/`, immutable and
named by the hash of their bytes, and small mutable manifests under `manifests/` that name
them. A backup directory holds:

    objects/     the content objects, in the object cache's layout (cache.py): each one
                 checked against its key when downloaded, so a later backup into the same
                 directory downloads only the objects that are new since (incremental)
    manifests/   the manifests as they were at this backup (replaced whole each time)
    backup.json  when, from which store, and how many of each

Manifests are listed and copied before the objects: a manifest is written only after the
objects it names are stored, so every object a copied manifest names is in the store when
the objects are listed (unless deleted in between, which the copy then reports missing).

A restore puts back every object the store lacks (an object it has is never sent again,
ObjectStore.put_file) and writes every manifest of the backup over the store's. It deletes
nothing: what was stored after the backup stays, manifests and objects (unreferenced by a
restored older database, it only takes space: gc.py deletes only objects no manifest names,
and nothing runs it yet, ADR 0016).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from pandastack.host.objects.config import ObjectStoreConfig
from pandastack.host.objects.keys import check_key, sha256_of_file
from pandastack.host.objects.store import ObjectStore

OBJECTS_DIR = "objects"
MANIFESTS_DIR = "manifests"
INFO_FILE = "backup.json"
# Downloads and uploads in flight at once (each also splits large objects into parts).
PARALLEL = 4


@dataclass(frozen=True)
class BackupCounts:
    objects: int  # content objects in the backup
    fetched: int  # of those, downloaded by this run (the others were there and checked)
    manifests: int
    missing: list[str]  # objects a copied manifest names that the store no longer had


@dataclass(frozen=True)
class RestoreCounts:
    objects: int  # content objects of the backup, each now in the store
    manifests: int


def _manifest_path(root: Path, name: str) -> Path:
    """The file of a manifest named `name` (names hold `/`); a name that would leave the
    directory is refused, whatever the store answered."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"the store lists a manifest name that is not a relative path: "
                         f"{name!r}")
    return root.joinpath(*parts)


def _keys_named(manifest: bytes) -> set[str]:
    """The object keys a manifest names: every 64-hex string in its JSON (manifests of
    snapshots, volumes and templates differ in shape; their keys all look so)."""
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, str):
            if _is_key(value):
                found.add(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    with contextlib.suppress(ValueError):  # not JSON: it names nothing we can check
        walk(json.loads(manifest))
    return found


async def _list_objects(store: ObjectStore) -> list[str]:
    keys: list[str] = []
    after: str | None = None
    while True:
        page, after = await asyncio.to_thread(store.bucket.list_page, after)
        keys += [key for key in page if _is_key(key)]
        if after is None:
            return keys


def _is_key(key: str) -> bool:
    try:
        check_key(key)
    except ValueError:
        return False  # a stray object under sha256/ (not ours): not copied
    return True


async def _bounded(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    """Runs the coroutine factories, PARALLEL at a time; the first failure stops the rest."""
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()
    await asyncio.gather(*(worker() for _ in range(min(PARALLEL, len(jobs)))))


async def backup_objects(store: ObjectStore, target: Path,
                         say: Callable[[str], None] = lambda _m: None) -> BackupCounts:
    """Copies the store into `target` (made mode 0700: the objects hold guest memory and
    disks), incrementally where `target` holds an earlier backup. `store`: backup_store's."""
    _check_pair(store, target)
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(target, 0o700)
    names = await asyncio.to_thread(store.bucket.list_manifests, "")
    fresh = target / (MANIFESTS_DIR + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    named: set[str] = set()
    for name in names:
        data = await asyncio.to_thread(store.bucket.get_manifest, name)
        if data is None:
            continue  # deleted since the listing: not part of this backup
        path = _manifest_path(fresh, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        named |= _keys_named(data)
    fresh.mkdir(exist_ok=True)
    say(f"{len(names)} manifests copied")

    keys = await _list_objects(store)
    had = {key for key in keys if store.cache.is_checked(key)}
    done = 0

    async def fetch(key: str) -> None:
        nonlocal done
        await store.get_file(key)
        done += 1
        if done % 50 == 0:
            say(f"{done}/{len(keys)} objects")
    await _bounded([functools.partial(fetch, key) for key in keys])

    # The new manifests replace the old only once every object is in: an interrupted run
    # leaves the previous backup whole.
    old = target / (MANIFESTS_DIR + ".old")
    shutil.rmtree(old, ignore_errors=True)
    current = target / MANIFESTS_DIR
    if current.exists():
        current.rename(old)
    fresh.rename(current)
    shutil.rmtree(old, ignore_errors=True)
    counts = BackupCounts(objects=len(keys), fetched=len(keys) - len(had),
                          manifests=len(names), missing=sorted(named - set(keys)))
    info = {"taken_at": time.time(), "store": store.config.describe(), **asdict(counts)}
    (target / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return counts


def backup_store(directory: Path, config: ObjectStoreConfig) -> ObjectStore:
    """The store `config` names, with the backup directory's `objects/` as its cache."""
    return ObjectStore(config, directory / OBJECTS_DIR)


def _check_pair(store: ObjectStore, directory: Path) -> None:
    if store.cache.root != directory / OBJECTS_DIR:
        raise ValueError(f"the store's cache is {store.cache.root}, not the backup's "
                         f"{directory / OBJECTS_DIR}: make it with backup_store()")


async def restore_objects(store: ObjectStore, source: Path,
                          say: Callable[[str], None] = lambda _m: None) -> RestoreCounts:
    """Puts the backup in `source` back into the store: the objects it lacks, then every
    manifest (objects first, so no manifest names an object not yet stored). `store`:
    backup_store's."""
    _check_pair(store, source)
    if not (source / INFO_FILE).is_file() or not (source / MANIFESTS_DIR).is_dir():
        raise ValueError(f"{source} holds no object store backup (no {INFO_FILE} and "
                         f"{MANIFESTS_DIR}/): make one with `pandastack backup objects`")
    keys = sorted(entry.path.name for entry in store.cache.entries()
                  if entry.path.parent != store.cache.files and _is_key(entry.path.name))
    for key in keys:
        # Hashed unless checked since it was last written (a copy of the directory made
        # elsewhere loses the record): a damaged backup is named, never half restored.
        path = store.cache.path_of(key)
        if not store.cache.is_checked(key) and sha256_of_file(path) != key:
            raise ValueError(f"the backup's object {path} does not hold the bytes its name "
                             "says (changed or truncated since the backup): nothing restored")

    async def put(key: str) -> None:
        await store.put_file(store.cache.path_of(key), key)
    await _bounded([functools.partial(put, key) for key in keys])
    say(f"{len(keys)} objects in the store")
    root = source / MANIFESTS_DIR
    manifests = sorted(p for p in root.rglob("*") if p.is_file())
    for path in manifests:
        name = path.relative_to(root).as_posix()
        await asyncio.to_thread(store.bucket.put_manifest, name, path.read_bytes())
    return RestoreCounts(objects=len(keys), manifests=len(manifests))
