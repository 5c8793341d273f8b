"""The guest protocol's room (spec/guest-protocol.md): what the host and the guest agents agree
on, and nothing of either side.

`frames`: the frame codec and the frame-level bounds; `ops`: the table of operations (request
fields with their types, defaults and bounds, reply kinds, streaming or not) and the bounds of
single operations. The host (host/agentlink) and the reference agent (pandastack.guest) import
these; the static agent (guest-agent/) is held to the same table by tests/guest/test_op_table.py.

Standard library only, no other pandastack module: the image builder installs these files into
a Python-agent guest as ``/opt/pandastack/pandastack/guestproto/``, beside the agent.
"""
