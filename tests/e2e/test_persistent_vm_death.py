"""Persistent means persistent (ADR 0037), with real `pandastack serve` processes and real VMs: a
persistent sandbox whose QEMU is SIGKILLed becomes `stopped` (its disk kept) and a wake boots
its disk with the files written before; the same after a server SIGKILL plus a QEMU SIGKILL and
its network namespace gone (a host reboot), where the first exec starts it again in its
namespace made again; a non-persistent one still ends `failed`; a server that dies between
ending the VM of a hibernation and recording it keeps the hibernation file, and the sandbox
wakes from it with its memory; one with a snapshot of itself restarts from that snapshot; the
reconcile at start removes an old snapshot without a row, keeps a young one and forgets a row
whose files are gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from pandastack.host.network.manager import GATEWAY_IP, NS_PREFIX, TAP
from pandastack.host.runtime.hibernation import CRASH_AT_ENV
from pandastack.host.runtime.records import HIBERNATION
from tests.e2e.test_server_restart import ServeProcess, wait_gone
from tests.e2e.test_server_restart import serve as serve_process
from tests.helpers import qemu_pids_under

pytestmark = [pytest.mark.vm, pytest.mark.e2e]

# Under TCG, with the rest of the suite on the same cores, a cold boot of a guest's disk
# takes tens of seconds.
SLOW = 300

# The restart test's fixture: a private `pandastack serve`, SIGKILLed and its VMs and files
# removed at the end.
serve = serve_process


def create(c: httpx.Client, *, persistent: bool) -> str:
    r = c.post("/v1/sandboxes", json={"ttl_seconds": 600, "persistent": persistent})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def write(c: httpx.Client, sid: str, path: str, data: bytes) -> None:
    r = c.put(f"/v1/sandboxes/{sid}/files", params={"path": path}, content=data)
    assert r.status_code == 200, r.text


def sh(c: httpx.Client, sid: str, cmd: str) -> dict[str, Any]:
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd}, timeout=SLOW)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def kill_vm(serve: ServeProcess, sid: str) -> None:
    pids = qemu_pids_under(serve.state_dir / sid)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    wait_gone(pids[0])


def wait_state(c: httpx.Client, sid: str, state: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info: dict[str, Any] = c.get(f"/v1/sandboxes/{sid}").json()
        if info["state"] == state or time.monotonic() > deadline:
            assert info["state"] == state, info
            return info
        time.sleep(0.3)


def wait_removed(path: Path, timeout: float = 60) -> None:
    """Until `path` is gone: a failed sandbox's row is marked before its files are removed."""
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, f"{path} was not removed"
        time.sleep(0.1)


def events_of(serve: ServeProcess, sid: str) -> list[tuple[str, dict[str, Any]]]:
    """The sandbox's events in the durable log, oldest first (read from the server's DB)."""
    with sqlite3.connect(serve.tmp / "pandastack.db") as db:
        rows = db.execute("SELECT type, data FROM events WHERE sandbox_id = ? ORDER BY id",
                          (sid,)).fetchall()
    return [(kind, json.loads(data)) for kind, data in rows]


def end_all(c: httpx.Client, serve: ServeProcess, *sids: str) -> None:
    for sid in sids:
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        assert not (serve.state_dir / sid).exists()
    assert not qemu_pids_under(serve.state_dir)


def test_qemu_sigkill_stops_a_persistent_sandbox_and_wake_boots_its_disk(
        serve: ServeProcess) -> None:
    serve.start()
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        kept, plain = create(c, persistent=True), create(c, persistent=False)
        for sid in (kept, plain):
            write(c, sid, "/work/kept.txt", b"on disk\n")
            # on disk for sure before the VM dies (the guest's page cache dies with it)
            assert sh(c, sid, "sync")["exit_code"] == 0
        # in guest memory only: gone after a boot of the disk
        assert sh(c, kept, "echo in-memory > /run/mem.txt")["exit_code"] == 0
        addr = sh(c, kept, "ip -4 -o addr show")["stdout"]
        kill_vm(serve, kept)
        kill_vm(serve, plain)

        info = wait_state(c, kept, "stopped")
        assert info["stop_reason"] and info["ended_at"] is None, info
        assert (serve.state_dir / kept).is_dir()  # its disk is kept
        ended = wait_state(c, plain, "failed")
        assert ended["end_reason"] == "VM exited unexpectedly", ended
        # The row ends first (no new request uses it), then its files go: wait for that.
        wait_removed(serve.state_dir / plain)

        r = c.post(f"/v1/sandboxes/{kept}/wake", timeout=SLOW)
        assert r.status_code == 200, r.text
        assert (r.json()["state"], r.json()["restored_from"]) == ("running", "disk"), r.json()
        out = sh(c, kept, "cat /work/kept.txt; test -e /run/mem.txt && echo mem-kept || "
                          "echo mem-gone")
        assert out["stdout"] == "on disk\nmem-gone\n", out
        r = c.get(f"/v1/sandboxes/{kept}/files", params={"path": "/work/kept.txt"})
        assert r.status_code == 200 and r.content == b"on disk\n"
        # the booted guest has the network it had, and hibernates and wakes as any other
        assert sh(c, kept, "ip -4 -o addr show")["stdout"] == addr
        assert sh(c, kept, "echo after-boot > /run/mem.txt")["exit_code"] == 0
        r = c.post(f"/v1/sandboxes/{kept}/hibernate", timeout=SLOW)
        assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
        assert sh(c, kept, "cat /run/mem.txt")["stdout"] == "after-boot\n"

        kinds = [(k, d.get("reason"), d.get("restored_from")) for k, d in events_of(serve, kept)]
        assert ("sandbox.stopped", "VM exited unexpectedly", None) in kinds, kinds
        assert ("sandbox.woken", None, "disk") in kinds, kinds
        assert [k for k, _ in events_of(serve, plain)][-1] == "sandbox.failed"
        end_all(c, serve, kept)


def test_server_and_qemu_sigkill_then_the_first_exec_starts_it_again_with_its_network(
        serve: ServeProcess) -> None:
    """What a host reboot does to a persistent sandbox: the server and the VM gone, and
    /run/netns emptied (its slot's claim is on disk and stays). The first exec boots its disk
    in its namespace made again; a non-persistent one ends `failed`."""
    serve.start()
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        kept, plain = create(c, persistent=True), create(c, persistent=False)
        for sid in (kept, plain):
            write(c, sid, "/work/kept.txt", b"before the crash\n")
            assert sh(c, sid, "sync")["exit_code"] == 0
    serve.signal(signal.SIGKILL)
    kill_vm(serve, kept)
    kill_vm(serve, plain)
    slot = json.loads((serve.state_dir / kept / "sandbox.json").read_text())["slot"]
    netns = f"{NS_PREFIX}{slot}"
    subprocess.run(["ip", "netns", "del", netns], check=True)

    serve.start()
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        info = c.get(f"/v1/sandboxes/{kept}").json()
        assert info["state"] == "stopped" and info["stop_reason"], info
        assert c.get(f"/v1/sandboxes/{plain}").json()["state"] == "failed"
        wait_removed(serve.state_dir / plain)
        # exec needs the VM: it starts the stopped sandbox first
        out = sh(c, kept, "cat /work/kept.txt")
        assert (out["exit_code"], out["stdout"]) == (0, "before the crash\n"), out
        info = c.get(f"/v1/sandboxes/{kept}").json()
        assert (info["state"], info["restored_from"], info["stop_reason"]) == (
            "running", "disk", None), info
        # its namespace is back, its tap held by the VM, and the guest reaches its gateway
        tap = subprocess.run(["ip", "-n", netns, "link", "show", TAP], capture_output=True,
                             text=True, check=True).stdout
        assert "LOWER_UP" in tap, tap
        # (a datagram to it makes the guest resolve its address: a complete ARP entry, flags
        # 0x2, is an answer from the host's side of the tap; the guest sends until it reads
        # one, for at most 20 s, where a fixed 1 s was sometimes short)
        out = sh(c, kept, f"""python3 -c '
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.monotonic() + 20
while time.monotonic() < end:
    s.sendto(b"x", ("{GATEWAY_IP}", 9))
    rows = [r.split() for r in open("/proc/net/arp").read().splitlines()[1:]]
    if [r[2] for r in rows if r[0] == "{GATEWAY_IP}"] == ["0x2"]:
        break
    time.sleep(0.2)
'; cat /proc/net/arp""")
        arp = [line.split() for line in out["stdout"].splitlines()[1:]]
        assert [a[2] for a in arp if a[0] == GATEWAY_IP] == ["0x2"], out
        end_all(c, serve, kept)
    assert "Traceback" not in serve.log_path.read_text(errors="replace"), serve.log_tail()


def test_a_crash_between_ending_the_vm_and_recording_the_hibernation_keeps_its_file(
        serve: ServeProcess) -> None:
    serve.start(extra_env={CRASH_AT_ENV: "hibernate-after-vm-ended"})
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        sid = create(c, persistent=True)
        write(c, sid, "/work/kept.txt", b"on disk\n")
        assert sh(c, sid, "echo in-memory > /run/mem.txt")["exit_code"] == 0
        with pytest.raises(httpx.TransportError):
            c.post(f"/v1/sandboxes/{sid}/hibernate", timeout=SLOW)
    assert serve.proc is not None
    assert serve.proc.wait(timeout=30) == 137  # the hook's exit, where the state is recorded
    serve.proc = None
    stream = serve.state_dir / sid / HIBERNATION
    assert stream.is_file() and stream.stat().st_size > 0
    assert not qemu_pids_under(serve.state_dir / sid)  # the VM had ended

    serve.start()  # without the hook
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        info = c.get(f"/v1/sandboxes/{sid}").json()
        assert info["state"] == "hibernated", info
        assert stream.is_file()
        r = c.post(f"/v1/sandboxes/{sid}/wake", timeout=SLOW)
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        # its memory came back: the hibernation was restored, not the disk booted
        out = sh(c, sid, "cat /work/kept.txt /run/mem.txt")
        assert out["stdout"] == "on disk\nin-memory\n", out
        assert not stream.exists()
        end_all(c, serve, sid)


def test_a_stopped_sandbox_with_a_snapshot_of_itself_restarts_from_it(
        serve: ServeProcess) -> None:
    # its snapshots in its own directory, removed with it whatever the outcome
    serve.start(extra_env={"PANDASTACK_SNAPSHOTS_DIR": str(serve.tmp / "snapshots")})
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        sid = create(c, persistent=True)
        assert sh(c, sid, "echo v1 > /work/f; echo in-memory > /run/mem.txt; sync")[
            "exit_code"] == 0
        r = c.post(f"/v1/sandboxes/{sid}/snapshots", json={}, timeout=SLOW)
        assert r.status_code == 201, r.text
        snap = r.json()["id"]
        assert sh(c, sid, "echo v2 > /work/f; sync")["exit_code"] == 0
        kill_vm(serve, sid)
        wait_state(c, sid, "stopped")

        r = c.post(f"/v1/sandboxes/{sid}/wake", timeout=SLOW)
        assert r.status_code == 200, r.text
        assert (r.json()["state"], r.json()["restored_from"]) == ("running", "snapshot")
        # the machine as it was at the snapshot, memory included
        out = sh(c, sid, "cat /work/f /run/mem.txt")
        assert out["stdout"] == "v1\nin-memory\n", out
        assert len(qemu_pids_under(serve.state_dir / sid)) == 1
        end_all(c, serve, sid)
        assert c.delete(f"/v1/snapshots/{snap}").status_code == 204


def test_reconcile_removes_an_old_snapshot_without_a_row_and_keeps_a_young_one(
        serve: ServeProcess) -> None:
    private = {"PANDASTACK_SNAPSHOTS_DIR": str(serve.tmp / "snapshots")}
    serve.start(extra_env=private)
    headers = {"Authorization": f"Bearer {serve.api_key()}"}
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        sid = create(c, persistent=False)
        snaps = []
        for _ in range(3):
            r = c.post(f"/v1/sandboxes/{sid}/snapshots", json={}, timeout=SLOW)
            assert r.status_code == 201, r.text
            snaps.append(r.json()["id"])
    serve.signal(signal.SIGKILL)
    old, young, lost = snaps
    root = serve.tmp / "snapshots"
    # As a crash between the host's snapshot and its row leaves them (one long ago), and a
    # snapshot whose files went while its row stayed.
    with sqlite3.connect(serve.tmp / "pandastack.db") as db:
        db.execute("DELETE FROM snapshots WHERE id IN (?, ?)", (old, young))
    meta = root / old / "snapshot.json"
    data = json.loads(meta.read_text())
    data["created_at"] -= 3600
    meta.write_text(json.dumps(data))
    shutil.rmtree(root / lost)

    serve.start(extra_env=private)
    with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as c:
        assert not (root / old).exists()
        assert (root / young).is_dir()
        assert c.get(f"/v1/snapshots/{lost}").status_code == 404
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        end_all(c, serve, sid)
