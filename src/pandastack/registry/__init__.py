"""The host registry: hosts, their heartbeats and epochs, and sandbox leases, in the shared
store (docs/adr/0017, 0019). The API servers use it through `server.store.Store` (a
`Registry` with the control plane's tables); an agent uses `Registry(engine)`, `Membership`
(registration, heartbeats, fencing, self-pause on partition) and `LeasedHost` (the host port
taking and releasing its sandboxes' leases). Imports only SQLAlchemy, the standard library
and `pandastack.hostport`.
"""

from .clock import db_now
from .models import Base, Host, Lease
from .queries import STALE_AFTER_SECONDS, HostRegistry, Registry, Usage, new_host_id

__all__ = ["STALE_AFTER_SECONDS", "Base", "Host", "HostRegistry", "Lease", "Registry", "Usage",
           "db_now", "new_host_id"]
