"""The MCP server: pandastack's sandboxes as tools for an agent (docs/adr/0032-mcp.md).

`tools.build_server(opener)` makes the tools over the Python SDK; `opener` hands each tool call
an `AsyncClient`. `pandastack mcp` (cli/mcp.py) serves them on stdio with the configured key;
the API server mounts them at `/mcp` (server/mcp.py) with the caller's key. This package is a
client: it never imports the server or the host.
"""
