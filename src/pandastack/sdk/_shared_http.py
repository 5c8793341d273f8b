"""The connection pools that sandbox handles made by `Sandbox.create`/`connect`/`list` (and
their async twins) share: one per server, key, CA bundle and timeouts, in this process.

Each such call used to build its own httpx client, so every create paid a TCP (and TLS)
connect and the first-request set-up of a new pool, and its `close()` threw the connection
away. Now the second create of a process reuses the first one's connection.

- Sync: one `HTTP` per configuration, closed at interpreter exit. httpx's client is safe to
  share between threads; no connection limit (a per-handle pool had none across handles, so
  many handles streaming at once must not queue for a shared one).
- Async: an `AsyncHTTP` belongs to the event loop its connections were opened on, so there is
  one per (running loop, configuration), closed when that loop shuts down its async
  generators (`asyncio.run` and pytest-asyncio do; a loop closed without doing so leaves the
  pool to the garbage collector). Without a running asyncio loop (another async library),
  the caller gets a pool of its own, as before.
- A process forked after using them drops them in the child (the sockets are the parent's).

Handles on a shared pool do not own it: their `close()` leaves it open for the next.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import os
import threading
from collections.abc import AsyncGenerator

import httpx

from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk.config import ClientConfig

__all__ = ["shared_async_http", "shared_http"]

_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=20)

PoolKey = tuple[str, ...]


def _key(config: ClientConfig) -> PoolKey:
    # httpx.Timeout is not hashable; its repr names every one of its values.
    return tuple(repr(getattr(config, f.name)) for f in dataclasses.fields(config))


_lock = threading.Lock()
_pools: dict[PoolKey, HTTP] = {}
# (id of the loop, key) -> (the loop, its pool, the generator that closes it with the loop)
_async_pools: dict[tuple[int, PoolKey],
                   tuple[asyncio.AbstractEventLoop, AsyncHTTP, AsyncGenerator[None, None]]] = {}


def shared_http(config: ClientConfig) -> HTTP:
    """This process's pool for `config`, opened on first use."""
    key = _key(config)
    with _lock:
        http = _pools.get(key)
        if http is None:
            http = _pools[key] = HTTP(config, limits=_LIMITS)
        return http


async def _closed_with_loop(key: tuple[int, PoolKey],
                            http: AsyncHTTP) -> AsyncGenerator[None, None]:
    # Started once and left suspended: the loop's shutdown_asyncgens() closes it, which runs
    # the finally block while the loop still runs, so the connections close cleanly.
    try:
        yield
    finally:
        with _lock:
            entry = _async_pools.get(key)
            if entry is not None and entry[1] is http:
                del _async_pools[key]
        await http.aclose()


async def shared_async_http(config: ClientConfig) -> tuple[AsyncHTTP, bool]:
    """The running loop's pool for `config` and False, or, without a running asyncio loop, a
    new pool and True (the caller owns it)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return AsyncHTTP(config), True
    key = (id(loop), _key(config))
    with _lock:
        # A loop closed without shutting down its generators: its pools can never be used
        # (and its id may be a new loop's).
        for stale in [k for k, (old, _, _) in _async_pools.items() if old.is_closed()]:
            del _async_pools[stale]
        entry = _async_pools.get(key)
        if entry is not None and entry[0] is loop:
            return entry[1], False
        http = AsyncHTTP(config, limits=_LIMITS)
        closer = _closed_with_loop(key, http)
        _async_pools[key] = (loop, http, closer)
    await closer.__anext__()  # registers it with the loop's async generator hooks
    return http, False


def _close_all() -> None:
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for http in pools:
        http.close()


_orphans: list[object] = []


def _forget_in_child() -> None:
    # The child opens its own. The parent's are kept referenced, never closed nor collected:
    # closing (or a collected generator's aclose) would end the parent's TLS sessions.
    global _lock
    _lock = threading.Lock()
    _orphans.extend([*_pools.values(), *_async_pools.values()])
    _pools.clear()
    _async_pools.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_in_child)
