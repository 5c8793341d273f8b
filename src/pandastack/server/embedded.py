"""The one place the control plane builds a host inside its own process: `pandastack serve`
on one machine, without a separate `pandastack agent`. Everything else in `server/` reaches
hosts only through the host port (`pandastack.hostport`); import-linter holds it to that."""

from __future__ import annotations

import logging

from pandastack.host.config import HostConfig
from pandastack.host.local import LocalHost
from pandastack.host.runtime import HostRuntime
from pandastack.hostport.protocols import RuntimePort

from .settings import Settings

log = logging.getLogger("pandastack.server")


def embedded_host(settings: Settings) -> RuntimePort:
    config = HostConfig.from_env(home=settings.home, state_dir=settings.state_dir,
                                 network_operator_allow=settings.network_operator_allow)
    return LocalHost(HostRuntime(config, progress=lambda message: log.info("%s", message)))
