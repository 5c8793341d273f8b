"""The database's clock lives with the host registry (`pandastack.registry.clock`)."""

from pandastack.registry.clock import db_now

__all__ = ["db_now"]
