"""E2B's `filesystem.Filesystem` service (spec/envd/filesystem/filesystem.proto) over our
guest operations: stat and list through `guestfs.describe`, make dir through
`guestfs.ensure`, move and remove through the agent's rename and remove, and watching
through the agent's inotify watch, as a stream (`WatchDir`) or as a watcher polled by id
(`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`: what the sync SDK uses).

A polled watcher lives in this server's memory: at most MAX_WATCHERS_PER_SANDBOX a
sandbox and MAX_WATCHERS a server, each holding at most MAX_QUEUED_EVENTS; it goes when
removed, when its watch ends (the directory or the sandbox went away) and its last events
were read, or when nobody polled it for WATCHER_IDLE_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from starlette.requests import Request

from pandastack.hostport.protocols import SandboxPort
from pandastack.hostport.watch import WatchEvent
from pandastack.server.sandboxes.service import SandboxService

from ..errors import E2bError
from ..target import SandboxTarget, target_of
from .connect import ConnectError, Message, Method, ServerStream, Unary
from .connect import field as get
from .guestfs import (
    connect_error_of,
    describe,
    describe_each,
    ensure,
    entry_info,
    resolve,
    user_of,
)

MAX_WATCHERS_PER_SANDBOX = 16
MAX_WATCHERS = 256
MAX_QUEUED_EVENTS = 4096
WATCHER_IDLE_SECONDS = 600.0
# A poll right after a change should see it: an empty watcher waits this long for a first
# event, then until the events pause for SETTLE_SECONDS (at most LINGER_SECONDS in all).
LINGER_SECONDS = 0.25
SETTLE_SECONDS = 0.03
DEFAULT_KEEPALIVE_SECONDS = 50.0
MAX_LISTDIR_DEPTH = 64

EVENT_TYPES = {"create": "EVENT_TYPE_CREATE", "write": "EVENT_TYPE_WRITE",
               "remove": "EVENT_TYPE_REMOVE", "rename": "EVENT_TYPE_RENAME",
               "chmod": "EVENT_TYPE_CHMOD"}


def _path(message: Message, name: str) -> str:
    value = get(message, name, "")
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{name} must be a string")
    return value


def _uint(message: Message, name: str) -> int:
    """A uint32 field: a JSON number or, as protobuf's JSON mapping allows, a decimal string."""
    value = get(message, name, 0)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
        raise ConnectError("invalid_argument", f"{name} must be an unsigned 32-bit integer")
    return value


def _bool(message: Message, name: str) -> bool:
    value = get(message, name, False)
    if not isinstance(value, bool):
        raise ConnectError("invalid_argument", f"{name} must be true or false")
    return value


async def _handle(target: SandboxTarget) -> SandboxPort:
    _, handle = await target.service.running(target.team, target.sandbox_id)
    return handle


def _translated(exc: BaseException) -> ConnectError:
    found = connect_error_of(exc)
    if found is None:
        raise exc
    return found


def _unary(fn: Callable[[Request, Message], Awaitable[Message]]) -> Unary:
    """The handler with our errors (guest, service, E2B-shaped) as Connect ones."""
    async def call(request: Request, message: Message) -> Message:
        try:
            return await fn(request, message)
        except ConnectError:
            raise
        except Exception as exc:
            raise _translated(exc) from None
    return Unary(call)


async def stat(request: Request, message: Message) -> Message:
    target = target_of(request)
    path = resolve(_path(message, "path"), user_of(target))
    entries = await describe(await _handle(target), path)
    return {"entry": entry_info(entries[0])}


async def list_dir(request: Request, message: Message) -> Message:
    target = target_of(request)
    path = resolve(_path(message, "path"), user_of(target))
    depth = _uint(message, "depth") or 1
    entries = await describe(await _handle(target), path, min(depth, MAX_LISTDIR_DEPTH),
                             follow_root=True)
    if entries[0].kind != "d" and entries[0].target_kind != "d":
        raise ConnectError("invalid_argument", f"path '{path}' is not a directory")
    ordered = sorted(entries[1:], key=lambda e: e.path)
    return {"entries": [entry_info(e) for e in ordered]}


async def make_dir(request: Request, message: Message) -> Message:
    target = target_of(request)
    user = user_of(target)
    path = resolve(_path(message, "path"), user)
    handle = await _handle(target)
    await ensure(handle, user, "dir", path)
    return {"entry": entry_info((await describe(handle, path))[0])}


async def move(request: Request, message: Message) -> Message:
    target = target_of(request)
    user = user_of(target)
    source = resolve(_path(message, "source"), user)
    destination = resolve(_path(message, "destination"), user)
    handle = await _handle(target)
    await describe(handle, source)  # a missing source is NotFound, as envd says
    try:
        await describe(handle, posixpath.dirname(destination))
    except E2bError as exc:
        if exc.status != 404:
            raise
        await ensure(handle, user, "parents", destination)  # envd makes them too
    await handle.rename(source, destination)
    return {"entry": entry_info((await describe(handle, destination))[0])}


async def remove(request: Request, message: Message) -> Message:
    target = target_of(request)
    path = resolve(_path(message, "path"), user_of(target))
    if path == "/":
        raise ConnectError("invalid_argument", "refusing to remove /")
    try:
        await (await _handle(target)).remove(path, recursive=True)
    except Exception as exc:
        error = _translated(exc)
        if error.code != "not_found":  # envd removes as os.RemoveAll does: gone is done
            raise error from None
    return {}


def _relative(root: str, path: str) -> str:
    if path.startswith("/"):
        rel = posixpath.relpath(path, root)
        return "" if rel == "." else rel
    return path


def fs_events(root: str, event: WatchEvent) -> list[Message]:
    """Our event as envd's (fsnotify's): a rename is the old name's RENAME, then the new
    name's CREATE; names are relative to the watched directory."""
    name = _relative(root, event.path)
    if event.type == "rename" and event.old_path is not None:
        return [{"name": _relative(root, event.old_path), "type": "EVENT_TYPE_RENAME"},
                {"name": name, "type": "EVENT_TYPE_CREATE"}]
    kind = EVENT_TYPES.get(event.type)
    return [] if kind is None else [{"name": name, "type": kind}]


async def with_entries(handle: SandboxPort, root: str, events: list[Message]
                       ) -> list[Message]:
    """`events` each with the EntryInfo of what is at its path now, where something is (one
    exec for them all; a removed or renamed-away entry has none, as in envd)."""
    paths = sorted({posixpath.join(root, e["name"]) for e in events})
    found = await describe_each(handle, paths)
    for e in events:
        entry = found.get(posixpath.join(root, e["name"]))
        if entry is not None:
            e["entry"] = entry_info(entry)
    return events


async def _open_watch(target: SandboxTarget, message: Message
                      ) -> tuple[str, AsyncIterator[list[WatchEvent]], SandboxPort, bool]:
    """A watch already set up in the guest (what changes from now on is seen), its root, the
    handle, and whether events carry their entries. Network mounts are watched like any
    directory (`allowNetworkMounts` is accepted): our guests' inotify sees local changes."""
    path = resolve(_path(message, "path"), user_of(target))
    recursive = _bool(message, "recursive")
    include_entry = _bool(message, "includeEntry")
    _bool(message, "allowNetworkMounts")
    handle = await _handle(target)
    batches = handle.watch(path, recursive=recursive)
    try:
        first = await anext(batches)
    except StopAsyncIteration:
        raise ConnectError("not_found", f"path '{path}' does not exist") from None
    except Exception as exc:
        with contextlib.suppress(Exception):
            await batches.aclose()  # type: ignore[attr-defined]
        error = _translated(exc)
        if "ENOTDIR" in error.message:
            raise ConnectError("invalid_argument",
                               f"path '{path}' is not a directory") from None
        raise error from None
    root = first[0].path if first and first[0].path.startswith("/") else path
    return root, batches, handle, include_entry


def _keepalive_seconds(request: Request) -> float:
    try:
        value = float(request.headers.get("keepalive-ping-interval", ""))
    except ValueError:
        return DEFAULT_KEEPALIVE_SECONDS
    return min(max(value, 1.0), 300.0)


async def watch_dir(request: Request, message: Message) -> AsyncIterator[Message]:
    target = target_of(request)
    try:
        root, batches, handle, include_entry = await _open_watch(target, message)
    except ConnectError:
        raise
    except Exception as exc:
        raise _translated(exc) from None
    interval = _keepalive_seconds(request)
    iterator = aiter(batches)
    pending: asyncio.Future[list[WatchEvent]] | None = None
    try:
        async with target.service.busy(target.sandbox_id):
            yield {"start": {}}
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(iterator))
                done, _ = await asyncio.wait({pending}, timeout=interval)
                if not done:
                    yield {"keepalive": {}}
                    continue
                task, pending = pending, None
                try:
                    batch = task.result()
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    raise _translated(exc) from None
                if any(event.type == "overflow" for event in batch):
                    raise ConnectError("resource_exhausted", "file events were lost (the "
                                       "client read too slowly): list again and watch anew")
                out = [fs for event in batch for fs in fs_events(root, event)]
                if include_entry and out:
                    out = await with_entries(handle, root, out)
                for fs in out:
                    yield {"filesystem": fs}
    finally:
        if pending is not None:
            pending.cancel()
        with contextlib.suppress(BaseException):
            await batches.aclose()  # type: ignore[attr-defined]


# -- polled watchers ----------------------------------------------------------------------


@dataclass
class Watcher:
    sandbox_id: str
    root: str
    handle: SandboxPort | None = None  # with include_entry: where to read the entries
    events: deque[Message] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    ended: ConnectError | None = None  # why the watch ended, told once the queue is read
    finished: bool = False
    polled_at: float = field(default_factory=time.monotonic)

    async def pull(self, batches: AsyncIterator[list[WatchEvent]]) -> None:
        try:
            async for batch in batches:
                for event in batch:
                    if event.type == "overflow":
                        self.ended = ConnectError("resource_exhausted", "file events were lost "
                                                  "(the guest's queue filled): watch anew")
                        return
                    for fs in fs_events(self.root, event):
                        if len(self.events) >= MAX_QUEUED_EVENTS:
                            self.ended = ConnectError(
                                "resource_exhausted", f"more than {MAX_QUEUED_EVENTS} events "
                                "waited unread: poll more often, or watch anew")
                            return
                        self.events.append(fs)
                self.arrived.set()
            self.ended = ConnectError("not_found", "the watched directory is gone")
        except Exception as exc:
            self.ended = connect_error_of(exc) or ConnectError("unavailable", "the watch broke")
        finally:
            self.finished = True
            self.arrived.set()
            with contextlib.suppress(Exception):
                await batches.aclose()  # type: ignore[attr-defined]

    async def take(self) -> list[Message]:
        self.polled_at = time.monotonic()
        if not self.events and not self.finished:
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), LINGER_SECONDS)
        deadline = self.polled_at + LINGER_SECONDS
        while self.events and not self.finished and time.monotonic() < deadline:
            seen = len(self.events)
            await asyncio.sleep(SETTLE_SECONDS)
            if len(self.events) == seen:
                break
        taken = list(self.events)
        self.events.clear()
        if self.handle is not None and taken:
            with contextlib.suppress(Exception):  # entries are best-effort, as in envd
                taken = await with_entries(self.handle, self.root, taken)
        return taken

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


class Watchers:
    """The polled watchers of one server (one SandboxService), by id."""

    def __init__(self) -> None:
        self.by_id: dict[str, Watcher] = {}

    def sweep(self) -> None:
        now = time.monotonic()
        for wid, w in list(self.by_id.items()):
            if now - w.polled_at > WATCHER_IDLE_SECONDS:
                w.stop()
                del self.by_id[wid]

    def add(self, watcher: Watcher) -> str:
        self.sweep()
        if len(self.by_id) >= MAX_WATCHERS:
            raise ConnectError("resource_exhausted", f"this server holds {MAX_WATCHERS} "
                               "watchers: remove some first")
        mine = sum(1 for w in self.by_id.values() if w.sandbox_id == watcher.sandbox_id)
        if mine >= MAX_WATCHERS_PER_SANDBOX:
            raise ConnectError("resource_exhausted", f"the sandbox has {mine} watchers: "
                               "remove some first")
        wid = "w-" + secrets.token_hex(12)
        self.by_id[wid] = watcher
        return wid

    def get(self, sandbox_id: str, wid: str) -> Watcher:
        found = self.by_id.get(wid)
        if found is None or found.sandbox_id != sandbox_id:  # another sandbox's is unknown
            raise ConnectError("not_found", f"watcher {wid[:64]!r} not found")
        return found

    def remove(self, sandbox_id: str, wid: str) -> None:
        self.get(sandbox_id, wid).stop()
        del self.by_id[wid]


_WATCHERS: weakref.WeakKeyDictionary[SandboxService, Watchers] = weakref.WeakKeyDictionary()


def watchers_of(service: SandboxService) -> Watchers:
    found = _WATCHERS.get(service)
    if found is None:
        found = _WATCHERS[service] = Watchers()
    return found


def _watcher_id(message: Message) -> str:
    wid = get(message, "watcherId", "")
    if not isinstance(wid, str) or not wid:
        raise ConnectError("invalid_argument", "watcherId is required")
    return wid


async def create_watcher(request: Request, message: Message) -> Message:
    target = target_of(request)
    registry = watchers_of(target.service)
    root, batches, handle, include_entry = await _open_watch(target, message)
    watcher = Watcher(target.sandbox_id, root, handle if include_entry else None)
    try:
        wid = registry.add(watcher)
    except ConnectError:
        with contextlib.suppress(Exception):
            await batches.aclose()  # type: ignore[attr-defined]
        raise
    watcher.task = asyncio.create_task(watcher.pull(batches))
    return {"watcherId": wid}


async def get_watcher_events(request: Request, message: Message) -> Message:
    target = target_of(request)
    registry = watchers_of(target.service)
    registry.sweep()
    wid = _watcher_id(message)
    watcher = registry.get(target.sandbox_id, wid)
    events = await watcher.take()
    if not events and watcher.finished:
        registry.by_id.pop(wid, None)
        if watcher.ended is not None:
            raise watcher.ended
    return {"events": events}


async def remove_watcher(request: Request, message: Message) -> Message:
    target = target_of(request)
    watchers_of(target.service).remove(target.sandbox_id, _watcher_id(message))
    return {}


METHODS: dict[str, Method] = {
    "Stat": _unary(stat),
    "ListDir": _unary(list_dir),
    "MakeDir": _unary(make_dir),
    "Move": _unary(move),
    "Remove": _unary(remove),
    "WatchDir": ServerStream(watch_dir),
    "CreateWatcher": _unary(create_watcher),
    "GetWatcherEvents": _unary(get_watcher_events),
    "RemoveWatcher": _unary(remove_watcher),
}
