"""Isolation between clones, many sandboxes at once, cleanup, and surviving a host crash."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.host.vmm.driver import pid_is_running
from pandastack.host.vmm.qemu.driver import VMM_OOM_SCORE_ADJ
from pandastack.hostport.errors import AgentError, VMExited
from tests.helpers import SandboxFactory, vmm_pids_under
from tests.leftovers import owned_tmpdir

pytestmark = pytest.mark.vm


async def test_clones_differ_and_clocks_are_current(sandbox_factory: SandboxFactory) -> None:
    a, b = await sandbox_factory(), await sandbox_factory()
    probe = ("head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; hostname; "
             "cat /etc/machine-id; date +%s.%N")
    outs = []
    for sbx in (a, b):
        before = time.time()
        result = await sbx.exec(probe)
        after = time.time()
        rand, host, mid, clock = result.stdout.decode().split()
        assert before - 1 <= float(clock) <= after + 1, (before, clock, after)
        outs.append((rand, host, mid))
    assert outs[0][0] != outs[1][0]
    assert outs[0][1] != outs[1][1] and outs[0][1] == a.hostname
    assert outs[0][2] != outs[1][2] and len(outs[0][2]) == 32


async def test_twenty_sandboxes_each_see_only_their_own_files(
        sandbox_factory: SandboxFactory) -> None:
    sandboxes = [await sandbox_factory() for _ in range(20)]
    await asyncio.gather(*(s.write_file(f"/work/owner-{s.id}", s.id.encode()) for s in sandboxes))
    results = await asyncio.gather(*(s.exec("ls /work") for s in sandboxes))
    for sbx, result in zip(sandboxes, results, strict=True):
        assert result.stdout.split() == [f"owner-{sbx.id}".encode()]


async def test_kill_removes_process_and_files(runtime: HostRuntime) -> None:
    sbx = await runtime.create()
    workdir = Path(sbx.workdir)
    assert vmm_pids_under(workdir)
    # The OOM killer's first choice, before the server and agent (ADR 0050).
    assert Path(f"/proc/{sbx.pid}/oom_score_adj").read_text() == f"{VMM_OOM_SCORE_ADJ}\n"
    await runtime.kill(sbx.id)
    assert not workdir.exists()
    assert not vmm_pids_under(workdir)
    assert sbx.id not in {h.id for h in runtime.list()}


async def test_a_call_in_flight_when_its_vm_dies_says_the_vm_died(
        sandbox_factory: SandboxFactory) -> None:
    """An exec running when its VMM is killed fails as VMExited (the API's 409 "the VM
    died"), not as a bare channel failure (a 503 that invites a retry): bench/chaos.py's QEMU
    kill met the 503 on 11 of 20 blows."""
    sbx = await sandbox_factory()
    running = asyncio.Event()

    def on_stdout(data: bytes) -> None:
        running.set()

    call = asyncio.create_task(sbx.exec("echo up; sleep 60", on_stdout=on_stdout))
    await asyncio.wait_for(running.wait(), 60)
    assert sbx.pid is not None
    os.kill(sbx.pid, signal.SIGKILL)
    with pytest.raises(VMExited, match="VM exited"):
        await asyncio.wait_for(call, 60)


async def test_garbage_on_agent_channel_is_contained(sandbox_factory: SandboxFactory) -> None:
    victim, bystander = await sandbox_factory(), await sandbox_factory()
    # Kill the agent and write garbage, then an oversized frame header, into the port
    # from inside the guest. The init restarts the agent afterwards.
    sabotage = textwrap.dedent("""
        for d in /sys/class/virtio-ports/*; do
          [ "$(cat $d/name)" = org.pandastack.agent ] && port=/dev/$(basename $d)
        done
        sleep 0.5
        pkill -9 -f 'pandastack-agen[t] --guest|python3 -m pandastack_gues[t]'
        printf 'this is not a frame\\000\\377\\376' > $port
        printf 'PS\\001\\000\\377\\377\\377\\377\\377\\377\\377\\377' > $port
    """)
    await victim.spawn(["setsid", "sh", "-c", sabotage])
    with pytest.raises(AgentError):
        await victim.exec("sleep 20", timeout=25)
    # The bystander never noticed, and the victim recovers on the next call.
    assert (await bystander.exec("echo fine")).stdout == b"fine\n"
    deadline = time.monotonic() + 30
    while True:
        try:
            result = await victim.exec("echo back")
            break
        except AgentError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    assert result.stdout == b"back\n"


HOST_SCRIPT = """
import asyncio, sys
from pathlib import Path
from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime

async def main():
    rt = HostRuntime(HostConfig.from_env(state_dir=Path(sys.argv[1])), progress=lambda m: None)
    await rt.start()
    a = await rt.create()
    b = await rt.create()
    await a.write_file("/work/note", b"survives")
    print(a.id, b.id, b.pid, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_host_crash_then_restart_adopts_running_and_cleans_dead(
        host_config: HostConfig) -> None:
    state = owned_tmpdir("pst-crash-")
    try:
        proc = subprocess.Popen([sys.executable, "-c", HOST_SCRIPT, str(state)],
                                stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[3])
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
        alive_id, dead_id, dead_pid = line.split()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        os.kill(int(dead_pid), signal.SIGKILL)  # this one dies while no host is watching
        # Gone as the runtime's start will judge it (a large VMM takes a while to exit).
        deadline = time.monotonic() + 30
        while pid_is_running(int(dead_pid)):
            assert time.monotonic() < deadline, "the killed VMM did not exit"
            await asyncio.sleep(0.05)

        rt = HostRuntime(HostConfig(home=host_config.home, state_dir=state,
                                    accel=host_config.accel), progress=lambda m: None)
        report = await rt.start()
        # The dead one's disk is kept (ADR 0037): adopted stopped, for the control plane to
        # wake or kill.
        assert sorted(report.adopted) == sorted([alive_id, dead_id])
        assert report.stopped == [dead_id] and dead_id not in report.cleaned
        assert rt.get(dead_id).state == "stopped" and rt.get(dead_id).pid is None
        await rt.kill(dead_id)
        assert not (state / dead_id).exists()
        adopted = rt.get(alive_id)
        assert await adopted.read_file_bytes("/work/note") == b"survives"
        assert (await adopted.exec("echo still-here")).stdout == b"still-here\n"
        await rt.kill(alive_id)
        await rt.close()  # also releases the network slots it prepared ahead
        assert list(state.iterdir()) == []
        assert vmm_pids_under(state) == []
    finally:
        for pid in vmm_pids_under(state):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(state)], check=False)
