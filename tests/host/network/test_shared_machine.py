"""Runtimes with their own PANDASTACK_HOME and state on one machine (ADR 0021): the start,
restart and sweep of one leaves the other's sandboxes (namespace, claim, VM) alone, and the
kill paths of both leave nothing behind. Real VMs with networking; traffic only from this
host to the sandboxes' own slot addresses."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.network.manager import NetworkError, NetworkManager, Slot, list_netns
from pandastack.host.runtime import HostRuntime
from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import pid_is_running
from tests.helpers import remove_private_dirs
from tests.leftovers import owned_tmpdir


def test_another_claims_dir_in_the_same_namespace_is_refused(tmp_path: Path) -> None:
    """Pure bookkeeping (nothing is built or swept): the registry is the test's own."""
    registry = tmp_path / "registry"
    first = NetworkManager(tmp_path / "a" / "claims", registry=registry)
    first.bind_namespace()
    slot = first.claim(tmp_path)
    other = NetworkManager(tmp_path / "b" / "claims", registry=registry)
    with pytest.raises(NetworkError, match="must share"):
        other.bind_namespace()
    other_pool = NetworkManager(tmp_path / "a" / "claims", "10.201.0.0/16", registry=registry)
    with pytest.raises(NetworkError, match="must share"):
        other_pool.bind_namespace()
    NetworkManager(tmp_path / "a" / "claims", registry=registry).bind_namespace()
    # Once the recorded dir holds no claim, another runtime may take the namespace over.
    first.release(slot)
    other.bind_namespace()


@pytest.fixture
def two_configs(host_config: HostConfig) -> Iterator[tuple[HostConfig, HostConfig]]:
    """A: the shared home. B: a home of its own that reaches the shared guest images and
    templates through symlinks (as the agents of `make cluster` do)."""
    home_b = owned_tmpdir("psh-")
    for name in ("cache", "templates"):
        (home_b / name).symlink_to(host_config.home / name)
    dirs = []
    configs = []
    for home in (host_config.home, home_b):
        state = owned_tmpdir("pss-")
        snaps = Path(f"{state}-snapshots")
        snaps.mkdir()
        dirs.append((state, snaps))
        configs.append(HostConfig.from_env(home=home, state_dir=state, snapshots_root=snaps))
    yield configs[0], configs[1]
    left = [remove_private_dirs(state, snaps) for state, snaps in dirs]
    shutil.rmtree(home_b, ignore_errors=True)
    assert left == [([], [])] * 2, f"left in the runtimes' state: {left}"


def answers_ping(slot: Slot, timeout: float = 10.0) -> bool:
    """An ICMP echo from the host to the slot address (DNATed to the guest) is answered."""
    ident = os.getpid() & 0xFFFF
    body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"pandastack"
    folded = sum(struct.unpack(f"!{len(body) // 2}H", body))
    folded = (folded >> 16) + (folded & 0xFFFF)
    checksum = ~(folded + (folded >> 16)) & 0xFFFF
    packet = body[:2] + struct.pack("!H", checksum) + body[4:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (slot.ns_ip, 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data, (source, _) = sock.recvfrom(2048)
            except TimeoutError:
                return False
            reply = data[(data[0] & 0x0F) * 4:]
            if source == slot.ns_ip and reply[0] == 0 and reply[4:6] == packet[4:6]:
                return True
    return False


async def intact(runtime: HostRuntime, sbx: SandboxHandle, slot: Slot, pid: int) -> None:
    """The sandbox's namespace, claim and VM are there and work."""
    assert slot.netns in list_netns()
    assert Path(f"/sys/class/net/{slot.host_veth}").exists()
    assert runtime.network.claims().get(slot.index) == runtime.sandboxes_dir / sbx.id
    assert pid_is_running(pid)
    result = await runtime.get(sbx.id).exec(["echo", "here"], timeout=60)
    assert result.exit_code == 0 and result.stdout.strip() == b"here", result
    assert answers_ping(slot), f"{sbx.id} does not answer on {slot.ns_ip}"


async def test_restarting_one_runtime_leaves_the_other_alone(
        two_configs: tuple[HostConfig, HostConfig]) -> None:
    config_a, config_b = two_configs
    assert config_a.home != config_b.home
    a, b = HostRuntime(config_a), HostRuntime(config_b)
    try:
        await a.start()
        await b.start()
        sa = await a.create()
        sb = await b.create()
        slot_a, slot_b = a.describe(sa.id)["slot"], b.describe(sb.id)["slot"]
        assert isinstance(slot_a, Slot) and isinstance(slot_b, Slot)
        assert slot_a.index != slot_b.index
        pid_a, pid_b = sa.pid, sb.pid
        assert pid_a is not None and pid_b is not None

        # B restarts (its VMs keep running), sweeping as it starts; then it sweeps again.
        await b.close()
        b = HostRuntime(config_b)
        report = await b.start()
        assert sb.id in report.adopted
        await b.slots.sweep()
        await intact(a, sa, slot_a, pid_a)
        await intact(b, sb, slot_b, pid_b)

        # And the other way round.
        await a.close()
        a = HostRuntime(config_a)
        report = await a.start()
        assert sa.id in report.adopted
        await a.slots.sweep()
        await intact(b, sb, slot_b, pid_b)
        await intact(a, sa, slot_a, pid_a)

        # Killing one runtime's sandbox takes nothing of the other's.
        await b.kill(sb.id)
        await intact(a, sa, slot_a, pid_a)
        await a.kill(sa.id)
        for slot, pid in ((slot_a, pid_a), (slot_b, pid_b)):
            assert slot.netns not in list_netns()
            assert not Path(f"/sys/class/net/{slot.host_veth}").exists()
            assert slot.index not in a.network.claims()
            assert not pid_is_running(pid)
    finally:
        for runtime in (a, b):
            await runtime.kill_all()
            await runtime.close()
    for runtime in (a, b):
        owned = [i for i, owner in runtime.network.claims().items()
                 if str(owner).startswith(str(runtime.sandboxes_dir))]
        assert owned == [], f"claims left by {runtime.sandboxes_dir}: {owned}"
        assert os.listdir(runtime.sandboxes_dir) == []
