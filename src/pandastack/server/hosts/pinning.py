"""A placement constraint carried by the request's context rather than by the host port: an
admin's `host_id=` on a create or fork pins it to that host. The port's calls stay the same
for one host and for many; only a pool of hosts reads it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..web.errors import ApiError

#: The host the calls made in this context must place their sandboxes on (None: any).
pinned_host: ContextVar[str | None] = ContextVar("pinned_host", default=None)


@contextmanager
def pinned_to(host_id: str | None, *, admin: bool) -> Iterator[None]:
    """Pin the calls inside to `host_id` (None: no pin); only an admin key may pin."""
    if host_id is None:
        yield
        return
    if not admin:
        raise ApiError(403, "forbidden", "only an admin key may choose the host (host_id)")
    token = pinned_host.set(host_id)
    try:
        yield
    finally:
        pinned_host.reset(token)
