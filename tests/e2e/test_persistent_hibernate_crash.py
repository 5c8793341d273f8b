"""A server that dies as a hibernation begins (its record says `hibernating`, the VM still
runs, no file written yet): at the next start the VM is ended and the persistent sandbox is
`stopped`, never removed; its wake boots its disk, which holds the files written just before
(the hibernation syncs the guest first). bench/chaos.py had found both broken: the sandbox's
directory was removed at start, and a file written a second before was lost with the guest's
page cache. Real `pandastack serve` processes, real VMs."""

from __future__ import annotations

import httpx
import pytest

from pandastack.host.runtime.hibernation import CRASH_AT_ENV
from pandastack.host.runtime.records import HIBERNATION
from tests.e2e.test_persistent_vm_death import SLOW, create, end_all, sh, wait_state, write
from tests.e2e.test_server_restart import ServeProcess
from tests.e2e.test_server_restart import serve as serve_process
from tests.helpers import qemu_pids_under

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

serve = serve_process


def test_a_crash_as_a_hibernation_begins_stops_the_sandbox_with_its_files(
        serve: ServeProcess) -> None:
    serve.start(extra_env={CRASH_AT_ENV: "hibernate-before-save"})
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        sid = create(c, persistent=True)
        write(c, sid, "/work/just-written.txt", b"kept\n")
        with pytest.raises(httpx.TransportError):
            c.post(f"/v1/sandboxes/{sid}/hibernate", timeout=SLOW)
    assert serve.proc is not None and serve.proc.wait(timeout=30) == 137
    serve.proc = None
    assert qemu_pids_under(serve.state_dir / sid), "the VM was to outlive the server"

    serve.start()  # without the hook
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        info = wait_state(c, sid, "stopped")
        assert info["stop_reason"], info
        assert not qemu_pids_under(serve.state_dir / sid)  # the half-saved VM was ended
        assert not (serve.state_dir / sid / HIBERNATION).exists()
        r = c.post(f"/v1/sandboxes/{sid}/wake", timeout=SLOW)
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert r.json()["restored_from"] == "disk", r.json()
        out = sh(c, sid, "cat /work/just-written.txt")
        assert out["stdout"] == "kept\n", out
        end_all(c, serve, sid)
