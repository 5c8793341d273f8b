"""`HostClient`: a `pandastack agent` process as the host port's `RuntimePort`, over its
host API (spec/host-openapi.json). Raises the port's own errors, re-made from the agent's
envelopes; an agent that cannot be reached raises HostUnavailable."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pandastack.hostport.frames import Kind
from pandastack.hostport.host_api.models import (
    BuildRequest,
    HostStatus,
    SandboxInfo,
    logins_model,
    network_model,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import BuildLog
from pandastack.hostport.registries import RegistryLogins
from pandastack.hostport.results import BuildResult
from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_VCPUS
from pandastack.templatespec import TemplateSpec

from .calls import Caller, api_path, parse
from .plain import install
from .sandbox import RemoteSandbox
from .transport import Timeouts

# The agent keeps its token beside its socket unless told otherwise (cli/agent.py).
TOKEN_BESIDE_SOCKET = "agent.token"


def read_token(path: Path | None, agent: str | None = None) -> str:
    """The token in `path`; without one, the file beside the unix socket of `agent` where
    `pandastack agent` keeps it by default."""
    if path is None:
        if agent is None or not agent.startswith("unix:"):
            raise ValueError("the agent's token file is not set (PANDASTACK_AGENT_TOKEN_FILE: "
                             "the file the agent was given with --token-file)")
        path = Path(agent.removeprefix("unix:")).parent / TOKEN_BESIDE_SOCKET
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the agent's token file {path}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"the agent's token file {path} is empty")
    return token


class HostClient:
    """The agent at `url` (`unix:/path/to.sock` or `http://host:port`), authenticated by
    `token`. `start()` checks that it answers and takes the token; `close()` closes this
    client's connections only (the agent and its sandboxes go on). The request/response
    operations of the port are rows of its operation table (plain.py); what is written here
    is the client's own, and the streamed build."""

    if TYPE_CHECKING:
        # The table's methods (plain.install, below), for the type checker.
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, url: str, token: str, *, timeouts: Timeouts | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """`tls`: how an https:// agent is verified and what client certificate it is
        shown (transport.agent_tls); None: the system's CAs, no client certificate."""
        self._caller = Caller(url, token, timeouts or Timeouts(), tls)
        self.address = url

    @classmethod
    def from_token_file(cls, url: str, token_file: Path | None = None, *,
                        timeouts: Timeouts | None = None) -> HostClient:
        """See `read_token` for where the token is found without `token_file`."""
        return cls(url, read_token(token_file, url), timeouts=timeouts)

    def __repr__(self) -> str:
        return f"<HostClient {self.address}>"

    async def __aenter__(self) -> HostClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _t(self) -> Timeouts:
        return self._caller.timeouts

    async def status(self) -> HostStatus:
        return await self._caller.model(HostStatus, "GET", api_path("host"), read=self._t.lookup)

    async def start(self) -> None:
        # The agent re-adopted its sandboxes when it started; this only makes sure it is
        # there and takes our token, so that a wrong setup fails at the control plane's start.
        await self.status()

    async def close(self) -> None:
        await self._caller.aclose()

    def handle(self, sandbox_id: str) -> RemoteSandbox:
        return RemoteSandbox(self._caller, SandboxInfo(id=sandbox_id, state="running",
                                                       alive=True))

    async def build_template(self, spec: TemplateSpec, *, log: BuildLog,
                             network: NetworkPolicy | None = None,
                             vcpus: int = DEFAULT_VCPUS, memory_mb: int = DEFAULT_MEMORY_MB,
                             cache_scope: str = "",
                             registry_logins: RegistryLogins | None = None) -> BuildResult:
        body = BuildRequest(spec=spec, network=network_model(network), vcpus=vcpus,
                            memory_mb=memory_mb, cache_scope=cache_scope,
                            registry_logins=logins_model(registry_logins))
        async with self._caller.stream("POST", api_path("templates", "builds"), json=body,
                                       read=None) as frames:
            async for frame in frames:
                if frame.kind is Kind.LOG:
                    log(frame.payload.decode("utf-8", "replace"))
        return parse(BuildResult, frames.result, self.address)


install(HostClient, on_sandbox=False)
