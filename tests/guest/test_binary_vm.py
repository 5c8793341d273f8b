"""The binary agent in real VMs (ADR 0038): a sandbox whose guest has no python3 still answers
exec, files and init, and its clones are distinct (entropy, hostname, machine-id) and on time.

Runs when the session's images have the binary agent (the default); with the reference Python
agent (`PANDASTACK_GUEST_AGENT=python`) it is skipped with that reason, since a guest without
python3 has no agent then."""

from __future__ import annotations

import time

import pytest

from pandastack.host.images.build import GUEST_AGENT_ENV, guest_agent_choice
from pandastack.host.runtime import HostRuntime
from tests.helpers import SandboxFactory

pytestmark = [
    pytest.mark.vm,
    pytest.mark.timeout(600),
    pytest.mark.skipif(guest_agent_choice() != "binary",
                       reason=f"the session's images have the Python agent ({GUEST_AGENT_ENV} "
                              "is 'python')"),
]

PROBE = ("head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; hostname; "
         "cat /etc/machine-id; date +%s.%N")


async def test_a_guest_without_python_answers_exec_files_and_init(
        runtime: HostRuntime, sandbox_factory: SandboxFactory) -> None:
    origin = await sandbox_factory()
    agent = await origin.exec("for p in /proc/[0-9]*; do readlink $p/exe; done 2>/dev/null "
                              "| grep -c -x /opt/pandastack/pandastack-agent; "
                              "pgrep -f pandastack_gues[t] || true")
    assert agent.stdout == b"1\n", agent  # the binary runs, and no Python agent
    gone = await origin.exec("rm -f \"$(readlink -f /usr/bin/python3)\"; "
                             "test -e /usr/bin/python3 && echo still-there")
    assert gone.stdout == b"", gone
    snap = await runtime.snapshot(origin.id, "no-python")
    try:
        clones = [await sandbox_factory(snapshot=snap.info.id) for _ in range(2)]
        seen = []
        for n, sbx in enumerate(clones):
            assert (await sbx.exec("python3 -c 1")).exit_code == 127
            await sbx.write_file(f"/work/f{n}", b"x" * 300_000)
            assert await sbx.read_file_bytes(f"/work/f{n}") == b"x" * 300_000
            before = time.time()
            out = (await sbx.exec(PROBE)).stdout.decode().split()
            after = time.time()
            assert before - 1 <= float(out[3]) <= after + 1, (before, out, after)
            seen.append(tuple(out[:3]))
        out = (await origin.exec(PROBE)).stdout.decode().split()
        seen.append(tuple(out[:3]))
        for column in range(3):
            assert len({s[column] for s in seen}) == 3, seen
    finally:
        runtime.delete_snapshot(snap.info.id)
