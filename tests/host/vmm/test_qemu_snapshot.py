"""Snapshots of a running guest must be one instant of it, and a VM that dies while it starts
must say so. No VM needed: QMP and the VM process are faked.

QEMU before 9.0 loses guest writes in a pre-copy migration under TCG (its dirty-bitmap sync
does not reset the TCG TLB). A child restored from such a stream had stale kernel pages, so its
kernel panicked right after the restore, QEMU exited (-no-reboot) and the create failed with
"agent channel closed during handshake". The driver now stops a TCG guest before it saves it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from qemu.qmp import ExecuteError
from qemu.qmp.message import Message
from qemu.qmp.models import ErrorResponse

from pandastack.host.runtime.sandbox import SandboxHandle
from pandastack.host.vmm.driver import SnapshotPause, VMPaths, VMProcess
from pandastack.host.vmm.host_memory import reports_free_pages
from pandastack.host.vmm.qemu import QemuDriver
from pandastack.host.vmm.qemu import driver as qemu
from pandastack.host.vmm.qemu.command import parse_release
from pandastack.hostport.errors import AgentConnectionError, SnapshotFailed

pytestmark = pytest.mark.timeout(30)

DEBIAN_7_2 = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"


def test_parse_release() -> None:
    assert parse_release(DEBIAN_7_2) == (7, 2)
    assert parse_release("QEMU emulator version 9.0.0") == (9, 0)
    assert parse_release("QEMU emulator version 10.1.2 (qemu-10.1.2-1)") == (10, 1)
    assert parse_release("something else") == (0, 0)


@pytest.mark.parametrize(("accel", "version", "live"), [
    ("tcg", DEBIAN_7_2, False),
    ("tcg", "QEMU emulator version 8.2.2", False),
    ("tcg", "QEMU emulator version 9.0.0", True),
    ("tcg", "not a version line", False),
    ("kvm", DEBIAN_7_2, True),
])
def test_precopy_only_where_dirty_tracking_holds(monkeypatch: pytest.MonkeyPatch, accel: str,
                                                 version: str, live: bool) -> None:
    monkeypatch.setattr(qemu, "qemu_version", lambda binary: version)
    assert QemuDriver(accel).live_precopy() is live
    assert QemuDriver(accel, precopy=not live).live_precopy() is (not live)


class FakeQMP:
    """Answers the commands snapshot_live sends, and records them. `background`: whether
    QEMU accepts a background snapshot (it refuses when guest RAM cannot be write-protected)."""

    def __init__(self, migration: str = "completed", background: bool = True,
                 ram: int = 64 << 20, writes: bytes = b"") -> None:
        self.ram = ram
        self.writes = writes  # what "QEMU" writes into the stream on migrate
        self.stream_fd: int | None = None
        self.running = True
        self.migration = migration
        self.accepts_background = background
        self.background = False
        self.sent: list[str] = []
        self.unfinalized_conts = 0  # `cont`s refused as if the migration thread had not ended

    async def execute(self, cmd: str, args: dict[str, Any] | None = None) -> object:
        self.sent.append(cmd)
        if cmd == "query-status":
            return {"running": self.running, "status": "running" if self.running else "paused"}
        if cmd == "migrate-set-capabilities":
            assert args is not None
            wanted = {c["capability"]: c["state"] for c in args["capabilities"]}
            if wanted["background-snapshot"] and not self.accepts_background:
                raise ExecuteError(ErrorResponse({"error": {
                    "class": "GenericError",
                    "desc": "Background-snapshot is not compatible with guest memory "
                            "configuration"}}), Message({}), Message({}))
            self.background = wanted["background-snapshot"]
        elif cmd == "stop":
            self.running = False
        elif cmd == "cont" and self.unfinalized_conts > 0:
            self.unfinalized_conts -= 1
            raise ExecuteError(ErrorResponse({"error": {
                "class": "GenericError", "desc": "Migration is not finalized yet"}}),
                Message({}), Message({}))
        elif cmd == "cont":
            self.running = True
        elif cmd == "migrate":
            if self.stream_fd is not None:
                os.write(self.stream_fd, self.writes)
                os.close(self.stream_fd)
                self.stream_fd = None
            # A background snapshot resumes the guest once its device state is captured; a
            # completed pre-copy migration leaves it stopped.
            self.running = self.background and self.migration == "completed"
        elif cmd == "query-migrate":
            return {"status": self.migration, "downtime": 3}
        elif cmd == "query-memory-size-summary":
            return {"base-memory": self.ram}
        return {}

    def send_fd_scm(self, fd: int) -> None:
        self.stream_fd = os.dup(fd)

    async def disconnect(self) -> None:
        pass


def _vm(tmp_path: Path) -> VMProcess:
    return VMProcess(0, VMPaths(tmp_path))


async def _snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, driver: QemuDriver,
                    fake: FakeQMP, *, short_pause: bool = False,
                    overwrite: bool = False) -> SnapshotPause:
    async def connect(path: Path, timeout: float = 0) -> FakeQMP:
        return fake

    monkeypatch.setattr(qemu, "connect_qmp", connect)
    return await driver.snapshot_live(_vm(tmp_path), tmp_path / "state.stream",
                                      tmp_path / "new-top.qcow2", short_pause=short_pause,
                                      overwrite=overwrite)


async def test_cont_waits_for_qemu_to_finish_a_completed_migration(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP()
    fake.unfinalized_conts = 3
    await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake)
    assert fake.sent.count("cont") == 4
    assert fake.running


async def test_tcg_snapshot_stops_the_guest_before_saving(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP()
    pause = await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake)
    assert fake.sent[0] == "query-status" and not fake.background
    # The disk is switched while the stopped guest's memory is written, not after it.
    sent = fake.sent
    assert sent.index("stop") < sent.index("migrate") < sent.index("blockdev-snapshot-sync")
    assert sent.index("blockdev-snapshot-sync") < sent.index("query-migrate")
    assert sent[-1] == "cont"
    assert fake.running
    assert pause.method == "stopped"
    assert pause.ms > 0  # the whole save, measured from the stop to the cont
    assert (tmp_path / "state.stream").exists()


async def test_stopped_save_reports_what_it_wrote(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP(writes=b"stream")
    pause = await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake)
    assert pause.stream_bytes == 6
    assert (tmp_path / "state.stream").read_bytes() == b"stream"


async def test_overwrite_writes_into_the_file_in_place_and_keeps_its_tail(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A warm buffer is written from its start, never truncated (its pages stay allocated);
    the stream's length comes back, and no short-pause (background) save is taken."""
    (tmp_path / "state.stream").write_bytes(b"x" * 100)
    fake = FakeQMP(writes=b"NEW")
    pause = await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake,
                            short_pause=True, overwrite=True)
    assert not fake.background and pause.method == "stopped"
    assert pause.stream_bytes == 3
    assert (tmp_path / "state.stream").read_bytes() == b"NEW" + b"x" * 97
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.stream"]


async def test_failed_overwrite_leaves_the_buffer_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "state.stream").write_bytes(b"x" * 10)
    fake = FakeQMP(migration="failed")
    with pytest.raises(SnapshotFailed):
        await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake,
                        overwrite=True)
    assert fake.running
    assert (tmp_path / "state.stream").read_bytes() == b"x" * 10


async def test_short_pause_snapshot_switches_the_disk_in_the_stop_qemu_ends(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A background snapshot: QEMU captures the device state in the stop and resumes the
    guest itself; the disk must be switched in that same stop, and nobody sends `cont`."""
    fake = FakeQMP()
    pause = await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake,
                            short_pause=True)
    assert fake.background
    sent = fake.sent
    assert sent.index("stop") < sent.index("blockdev-snapshot-sync") < sent.index("migrate")
    assert "cont" not in sent
    assert fake.running and pause.method == "background" and pause.ms > 0
    # The reserved space is given back: the stream ends where QEMU stopped writing.
    assert (tmp_path / "state.stream").stat().st_size == 0


async def test_short_pause_falls_back_to_stopping_when_qemu_refuses(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP(background=False)
    pause = await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake,
                            short_pause=True)
    assert not fake.background and pause.method == "stopped"
    assert fake.sent.index("migrate") < fake.sent.index("blockdev-snapshot-sync")
    assert fake.sent[-1] == "cont" and fake.running


async def test_failed_short_pause_snapshot_keeps_the_guest_running_on_its_new_disk(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP(migration="failed")
    with pytest.raises(SnapshotFailed) as failed:
        await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake,
                        short_pause=True)
    assert failed.value.disk_switched  # the caller must record the new top layer
    assert fake.running
    assert not (tmp_path / "state.partial").exists()


async def test_short_pause_snapshot_reserves_its_stream_before_stopping_the_guest(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """QEMU 7.2 leaves the guest hung when a background snapshot cannot write its stream, so
    the space is reserved first: no room means a clean error, the guest never stopped."""
    fake = FakeQMP(ram=1 << 50)
    with pytest.raises(SnapshotFailed) as failed:
        await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake,
                        short_pause=True)
    assert not failed.value.disk_switched
    assert "stop" not in fake.sent and "migrate" not in fake.sent and fake.running
    assert list(tmp_path.iterdir()) == []


async def test_precopy_snapshot_lets_the_guest_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP()
    pause = await _snapshot(monkeypatch, tmp_path, QemuDriver("kvm"), fake)
    assert "stop" not in fake.sent and pause.method == "precopy"
    assert fake.sent[-2:] == ["blockdev-snapshot-sync", "cont"]


async def test_failed_stopped_snapshot_resumes_the_guest(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeQMP(migration="failed")
    with pytest.raises(SnapshotFailed) as failed:
        await _snapshot(monkeypatch, tmp_path, QemuDriver("tcg", precopy=False), fake)
    assert failed.value.disk_switched  # during the save: the caller records the new top
    assert "stop" in fake.sent and fake.sent[-1] == "cont"
    assert fake.running
    assert not (tmp_path / "state.partial").exists()


async def _dies_unanswered(vmm_end: socket.socket) -> bytes:
    """The VMM side of the agent channel: takes what the host sends, then goes away."""
    vmm_end.setblocking(False)
    got = await asyncio.get_running_loop().sock_recv(vmm_end, 1 << 16)
    vmm_end.close()
    return got


async def _initialize_unanswered(proc: subprocess.Popen[bytes],
                                 tmp_path: Path) -> tuple[AgentConnectionError, bytes]:
    """Initialize a sandbox whose VMM is `proc` over a channel the VMM side closes unanswered;
    return the error raised and what the host sent."""
    vm = VMProcess(proc.pid, VMPaths(tmp_path), proc)
    host_end, vmm_end = socket.socketpair()
    vm.agent_connection = host_end
    dying = asyncio.create_task(_dies_unanswered(vmm_end))
    handle = SandboxHandle(  # type: ignore[abstract]  # its listings: see sandbox.py
        "sbx-000000000000", vm, tmp_path, "sbx-000000000000", 0.0, 5.0)
    with pytest.raises(AgentConnectionError) as err:
        await handle.initialize("0" * 32)
    return err.value, await dying


PANIC_CONSOLE = """\
[    5.306499] PKRU: 55555554
[    5.306585] Kernel panic - not syncing: Fatal exception in interrupt
[    5.307468] Kernel Offset: disabled
"""


async def test_vm_that_dies_during_the_handshake_is_named(tmp_path: Path) -> None:
    """The sequence seen: the host sends hello + init, then the channel closes unanswered
    because the guest panicked and QEMU exited (status 0). The error says so."""
    (tmp_path / "console.log").write_text(PANIC_CONSOLE)
    proc = subprocess.Popen(["true"])
    proc.wait()
    error, sent = await _initialize_unanswered(proc, tmp_path)
    assert b'"t":"hello"' in sent.replace(b" ", b"")  # hello (+ init) was sent
    message = str(error)
    assert "agent channel closed during handshake" in message
    assert "the VM exited with status 0" in message
    assert "Kernel panic - not syncing: Fatal exception in interrupt" in message


async def test_channel_closed_while_the_vm_runs_is_reported_as_is(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        error, _ = await _initialize_unanswered(proc, tmp_path)
        assert str(error) == "agent channel closed during handshake"
    finally:
        proc.kill()
        proc.wait()


def _virtio_device(root: Path, name: str, device: str, features: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "device").write_text(device + "\n")
    (root / name / "features").write_text(features + "\n")


def test_free_page_reporting_is_read_off_the_balloon_device(tmp_path: Path) -> None:
    assert not reports_free_pages(tmp_path)  # no virtio devices: not a VM of that kind
    _virtio_device(tmp_path, "virtio1", "0x0002", "0110010100")  # a block device
    assert not reports_free_pages(tmp_path)
    _virtio_device(tmp_path, "virtio0", "0x0005", "0110000000")  # a balloon, no reporting
    assert not reports_free_pages(tmp_path)
    _virtio_device(tmp_path, "virtio9", "0x0005", "0110010100")  # bit 5: free page reporting
    assert reports_free_pages(tmp_path)
