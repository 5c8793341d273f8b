"""The client of the host API: a `pandastack agent` process as the host port
(`pandastack.hostport.protocols.RuntimePort`). It never imports `pandastack.host`: what it
shares with the agent is `pandastack.hostport` (wire models, frames, errors)."""

from .client import HostClient, read_token
from .sandbox import RemoteSandbox
from .transport import Timeouts, agent_tls

__all__ = ["HostClient", "RemoteSandbox", "Timeouts", "agent_tls", "read_token"]
