"""`pandastack mcp`: the MCP server on stdio, for agent runtimes that spawn their tools
(Claude Desktop, Cursor, an agent framework's stdio client). It is a client like `pandastack
sandbox`: it acts through the REST API with the configured key (`PANDASTACK_API`,
`PANDASTACK_API_KEY` or ~/.config/pandastack/config.json), so its sandboxes are that key's
team's. stdout carries the protocol only; logs go to stderr.

    {"mcpServers": {"pandastack": {"command": "pandastack", "args": ["mcp"]}}}

Needs the `mcp` package: pip install 'pandastack[mcp]' (the server extra has it too).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

__all__ = ["MCP_EXTRA", "add_parser", "run"]

MCP_EXTRA = "pandastack[mcp]"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("mcp", help="serve the MCP tools on stdio (for agent runtimes)",
                   description="The MCP server on stdin/stdout: tools to create sandboxes, "
                               "run commands and code, read and write files. Configured as "
                               "`pandastack sandbox` is (PANDASTACK_API, PANDASTACK_API_KEY).")


async def _serve() -> None:
    from pandastack.mcp.tools import build_server, shared
    from pandastack.sdk import AsyncClient

    async with AsyncClient() as client:
        await build_server(lambda _ctx: shared(client)).run_stdio_async()


def _have_mcp() -> bool:
    try:
        return importlib.util.find_spec("mcp") is not None
    except ImportError:  # a broken or blocked install counts as none
        return False


def run(args: argparse.Namespace) -> int:
    if not _have_mcp():
        print(f"error: pandastack mcp needs the mcp package: pip install '{MCP_EXTRA}'",
              file=sys.stderr)
        return 1
    import anyio

    from pandastack.sdk import ConfigError

    try:
        anyio.run(_serve)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
