"""pandastack: microVM sandboxes for code that an AI agent wrote.

    from pandastack import Sandbox

    with Sandbox.create(template="base", ttl_seconds=900) as sbx:
        print(sbx.exec("uname -a").stdout)
"""

from typing import TYPE_CHECKING, Any

from pandastack._version import __version__

if TYPE_CHECKING:
    from pandastack.sdk import (
        APIConnectionError,
        APIError,
        AsyncClient,
        AsyncProcess,
        AsyncSandbox,
        AuthenticationError,
        AuthError,
        Client,
        CodeContext,
        CodeEvent,
        ConfigError,
        ConflictError,
        CreatedKey,
        ExecResult,
        Execution,
        FileEntry,
        ForkResult,
        HostUnavailableError,
        InsufficientStorageError,
        InvalidRequestError,
        KeyInfo,
        Lifecycle,
        Logs,
        NetworkSpec,
        NotFoundError,
        PandastackError,
        PayloadTooLargeError,
        PermissionDeniedError,
        Process,
        ProcessInfo,
        ProtocolError,
        RateLimitError,
        Result,
        Sandbox,
        SandboxError,
        SandboxInfo,
        ServerError,
        SnapshotInfo,
        Template,
        TemplateBuildError,
        TemplateBuildingError,
        TimeoutError,
        TransportError,
        TransportTimeoutError,
        ValidationError,
        VolumeInfo,
        VolumeInUseError,
        VolumeMount,
        WaitTimeoutError,
        WriteResult,
        from_dockerfile,
        wait_for_command,
        wait_for_file,
        wait_for_port,
    )


def __getattr__(name: str) -> Any:
    # The SDK (httpx, pydantic) is loaded on first use, so the host runtime and the guest
    # protocol codec, which also live in this package, do not pay for importing it.
    if name in __all__ and name != "__version__":
        from pandastack import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'pandastack' has no attribute {name!r}")

__all__ = [
    "APIConnectionError",
    "APIError",
    "AsyncClient",
    "AsyncProcess",
    "AsyncSandbox",
    "AuthError",
    "AuthenticationError",
    "Client",
    "CodeContext",
    "CodeEvent",
    "ConfigError",
    "ConflictError",
    "CreatedKey",
    "ExecResult",
    "Execution",
    "FileEntry",
    "ForkResult",
    "HostUnavailableError",
    "InsufficientStorageError",
    "InvalidRequestError",
    "KeyInfo",
    "Lifecycle",
    "Logs",
    "NetworkSpec",
    "NotFoundError",
    "PandastackError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Process",
    "ProcessInfo",
    "ProtocolError",
    "RateLimitError",
    "Result",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "ServerError",
    "SnapshotInfo",
    "Template",
    "TemplateBuildError",
    "TemplateBuildingError",
    "TimeoutError",
    "TransportError",
    "TransportTimeoutError",
    "ValidationError",
    "VolumeInUseError",
    "VolumeInfo",
    "VolumeMount",
    "WaitTimeoutError",
    "WriteResult",
    "__version__",
    "from_dockerfile",
    "wait_for_command",
    "wait_for_file",
    "wait_for_port",
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
