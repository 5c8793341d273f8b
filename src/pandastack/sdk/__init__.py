"""The pandastack Python SDK: sync (`Sandbox`, `Client`) and async (`AsyncSandbox`,
`AsyncClient`) twins with identical surfaces, over the REST API of `pandastack.server`.

Configure with `PANDASTACK_API` / `PANDASTACK_API_KEY`, `~/.config/pandastack/config.json`, or
`api_url=` / `api_key=` arguments (see `pandastack.sdk.config`).
"""

from pandastack.sdk.async_sandbox import AsyncSandbox
from pandastack.sdk.client import AsyncClient, AsyncKeys, AsyncSandboxes, Client, Keys, Sandboxes
from pandastack.sdk.commands import AsyncCommands, AsyncProcess, Commands, Process
from pandastack.sdk.config import DEFAULT_TIMEOUT, ClientConfig, resolve_config
from pandastack.sdk.errors import (
    APIError,
    AuthenticationError,
    ConfigError,
    ConflictError,
    NotFoundError,
    PandastackError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitError,
    ServerError,
    TransportError,
    TransportTimeoutError,
    ValidationError,
    WaitTimeoutError,
)
from pandastack.sdk.filesystem import AsyncFilesystem, Filesystem
from pandastack.sdk.models import (
    AsyncOutputCallback,
    CreatedKey,
    ExecResult,
    FileEntry,
    KeyInfo,
    Lifecycle,
    Logs,
    OutputCallback,
    ProcessInfo,
    SandboxInfo,
    SandboxState,
    WriteResult,
)
from pandastack.sdk.sandbox import Sandbox

__all__ = [
    "DEFAULT_TIMEOUT",
    "APIError",
    "AsyncClient",
    "AsyncCommands",
    "AsyncFilesystem",
    "AsyncKeys",
    "AsyncOutputCallback",
    "AsyncProcess",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AuthenticationError",
    "Client",
    "ClientConfig",
    "Commands",
    "ConfigError",
    "ConflictError",
    "CreatedKey",
    "ExecResult",
    "FileEntry",
    "Filesystem",
    "KeyInfo",
    "Keys",
    "Lifecycle",
    "Logs",
    "NotFoundError",
    "OutputCallback",
    "PandastackError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Process",
    "ProcessInfo",
    "ProtocolError",
    "RateLimitError",
    "Sandbox",
    "SandboxInfo",
    "SandboxState",
    "Sandboxes",
    "ServerError",
    "TransportError",
    "TransportTimeoutError",
    "ValidationError",
    "WaitTimeoutError",
    "WriteResult",
    "resolve_config",
]
