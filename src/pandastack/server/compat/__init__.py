"""Compatibility rooms: other platforms' wire contracts answered over pandastack's own service
layer. Each room translates and calls what our routes call; none adds a host-port or guest
operation (docs/adr/0041-e2b-compatibility.md)."""
