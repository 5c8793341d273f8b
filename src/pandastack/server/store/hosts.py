"""The host registry's queries live in `pandastack.registry` (the agents use them too);
`Store` mixes them in."""

from pandastack.registry.queries import (
    STALE_AFTER_SECONDS,
    HostRegistry,
    Registry,
    Usage,
    new_host_id,
)

__all__ = ["STALE_AFTER_SECONDS", "HostRegistry", "Registry", "Usage", "new_host_id"]
