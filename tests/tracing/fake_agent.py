"""`python -m tests.tracing.fake_agent DIR`: the host API as `pandastack agent` serves it, over
a host runtime with the fake VMM driver (tests/host/fake_vmm.py: no root, no VM), on
DIR/agent.sock with its token in DIR/agent.token; its spans exported as the agent's are
(`tracing.configure_from_env`, from the standard OTEL_* variables it inherits)."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import uvicorn

from pandastack.host import config as host_config
from pandastack.host.api import create_host_app
from pandastack.host.config import HostConfig
from pandastack.host.local import LocalHost
from pandastack.host.runtime import HostRuntime
from pandastack.tracing import AGENT_SERVICE, configure_from_env
from tests.host import fake_vmm
from tests.host.runtime.test_runtime_fake_vmm import fake_images


def main(argv: list[str]) -> int:
    tmp = Path(argv[0])
    # The host-wide claim directories, private to this agent (as tests.helpers does).
    host_config.FORK_BUFFERS_ROOT = tmp / "fork-buffers"
    host_config.HUGETLB_CLAIMS_ROOT = tmp / "hugetlb"
    config = HostConfig(home=tmp / "home", state_dir=tmp / "s", snapshots_root=tmp / "snaps",
                        vmm=fake_vmm.NAME, networking=False, memory_stage_dir=None,
                        fork_buffer_s=0, stream_hugetlb_mb=0, dns="off")
    token = secrets.token_hex(16)
    (tmp / "agent.token").write_text(token)
    configure_from_env(AGENT_SERVICE)
    runtime = HostRuntime(config, progress=lambda message: None,
                          images=fake_images(config.home))
    app = create_host_app(LocalHost(runtime), token, manage_host=True)
    uvicorn.run(app, uds=str(tmp / "agent.sock"), log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
