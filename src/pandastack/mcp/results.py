"""What the tools hand back to the model: JSON text (and the same as structured content),
images as MCP image content, errors as tool errors carrying the API's code and message."""

from __future__ import annotations

import json
from typing import Any

from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent

from pandastack.sdk.errors import APIError, PandastackError

# What a model reads of one output stream; past it the middle is cut (errors and summaries
# are usually at the end, the command's first lines say what it is).
MAX_OUTPUT_CHARS = 50_000


class ToolFailure(Exception):
    """A tool's own refusal (an input over a bound, a file too large to return)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def clip(text: str, limit: int = MAX_OUTPUT_CHARS) -> tuple[str, bool]:
    """`text`, or its first quarter and last three quarters of `limit` around a marker."""
    if len(text) <= limit:
        return text, False
    head = limit // 4
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}", True


def ok(payload: dict[str, Any], images: list[tuple[str, str]] | None = None) -> CallToolResult:
    """A success: `payload` as JSON text and structured content, then each (base64, mime)."""
    content: list[ContentBlock] = [TextContent(type="text", text=json.dumps(payload))]
    content += [ImageContent(type="image", data=data, mime_type=mime)
                for data, mime in images or []]
    return CallToolResult(content=content, structured_content=payload)


def failure(code: str, message: str, status: int | None = None,
            request_id: str | None = None) -> CallToolResult:
    error: dict[str, Any] = {"code": code, "message": message}
    if status is not None:
        error["status"] = status
    if request_id is not None:
        error["request_id"] = request_id
    payload = {"error": error}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(payload))],
                          structured_content=payload, is_error=True)


def from_exception(exc: Exception) -> CallToolResult:
    """A tool error for what the SDK (or the tool) raised; anything else is `internal`, with
    no detail a caller could use against the server."""
    if isinstance(exc, ToolFailure):
        return failure(exc.code, exc.message)
    if isinstance(exc, APIError):
        return failure(exc.code, exc.message, exc.status, exc.request_id)
    if isinstance(exc, PandastackError):
        return failure(type(exc).__name__, str(exc))
    return failure("internal", f"the tool failed unexpectedly ({type(exc).__name__})")
