"""The REST API's wire contract, shared by the server and the SDK: one module per part of the
API (`sandboxes`, `resources`, `events`, `pty`, `usage`) over one base (`base.Strict`).

Field names are the JSON field names. Everything a client sends is validated here first:
unknown fields are rejected, sizes and ranges are bounded. Limits and defaults live in
`pandastack.rules`; import them from there. This module imports none of its parts, so that
the template spec (which the parts use) can build on `base` alone.
"""
