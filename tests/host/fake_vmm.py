"""A fake VMM driver for unit tests of the runtime's own logic: no root, no VM, no QEMU.

Its "VMM" is a real process in its own session, as a real VMM is: it serves the real guest
agent (pandastack.guest in its test mode, which runs commands on this host and never changes
the machine) on the VM's agent socket, one connection after another. So the runtime's
adoption (from /proc command lines and `owns`), kills, wakes and agent handshakes are the real
ones; memory, device state, snapshot streams and disk layers are small files of JSON.

Importing this module registers the driver as "fake" (`HostConfig(vmm="fake")`). A test makes
it fail where it wants to through `FakeDriver.fail` (the runtime's driver: `rt.driver`).

It is the runtime's second driver (QEMU's is the first, host/vmm/qemu/), and declares only
what it does (`CAPABILITIES`): no live migration, no layer merges, no hugetlb RAM, no disk
resize. A test takes more away through `FakeDriver.capabilities` (ADR 0043).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pandastack.host.config import HostConfig
from pandastack.host.vmm import factory
from pandastack.host.vmm.driver import (
    Capability,
    KernelSpec,
    MachineShape,
    MigrationStats,
    SnapshotFiles,
    SnapshotPause,
    VMPaths,
    VMProcess,
    connect_unix,
    read_cmdline,
)
from pandastack.hostport.errors import VMMError

NAME = "fake"
# In the command line of every fake VMM: how its processes are told from all others.
MARK = "--pandastack-fake-vmm"
START_TIMEOUT_S = 10.0
# Its saves write what they are given (a nominal pause), in place where asked.
CAPABILITIES = frozenset({Capability.SHORT_PAUSE_SAVES, Capability.STREAM_IN_PLACE})

# The fake VMM process (`python -c SERVE MARK --workdir W --agent-socket S --disk D`).
SERVE = """
import socket, sys
from pandastack.guest.agent import Agent
from pandastack.guest.channel import SocketChannel
args = sys.argv[1:]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(args[args.index("--agent-socket") + 1])
server.listen(1)
while True:
    conn, _ = server.accept()
    agent = Agent(SocketChannel(conn.detach()), guest=False)
    agent.run()
    agent.procs.kill_all()
"""


class FakeProcesses:
    def is_vmm(self, argv: Sequence[str]) -> bool:
        return MARK in argv

    def vm_workdir(self, argv: Sequence[str]) -> Path | None:
        if MARK not in argv or "--workdir" not in argv:
            return None
        at = list(argv).index("--workdir") + 1
        return Path(argv[at]) if at < len(argv) else None


class FakeLayers:
    """Layers are JSON files naming their parent (by file name when it sits next to them,
    as a qcow2 chain does) and their size; a template's disk names the raw rootfs."""

    suffix = ".fake"

    def create_base(self, path: Path, rootfs: Path) -> None:
        _write_json(path, {"parent": str(rootfs.resolve()), "size": rootfs.stat().st_size,
                           "raw_parent": True})

    def create_layer(self, path: Path, parent: Path, size_bytes: int) -> None:
        same_dir = parent.parent.resolve() == path.parent.resolve()
        name = parent.name if same_dir else str(parent.resolve())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "w") as f:
            json.dump({"parent": name, "size": size_bytes}, f)

    def rebase(self, path: Path, parent: Path) -> None:
        layer = json.loads(path.read_text())
        same_dir = parent.parent.resolve() == path.parent.resolve()
        layer["parent"] = parent.name if same_dir else str(parent.resolve())
        _write_json(path, layer)

    def virtual_size(self, path: Path) -> int:
        return int(json.loads(path.read_text())["size"])

    def layer_chain(self, top: Path) -> list[Path]:
        chain = [top]
        while True:
            layer = json.loads(chain[-1].read_text())
            chain.append(chain[-1].parent / layer["parent"])  # an absolute parent stays so
            if layer.get("raw_parent"):
                return chain

    async def start_flatten(self, vm: VMProcess, base: Path) -> None:
        pass

    async def settle_flatten(self, vm: VMProcess, base: Path, wait_s: float) -> bool:
        return False  # as if every merge was cancelled: the chain only stays long


class FakeDriver:
    name = NAME
    accel = "fake"
    volume_slots = 4
    disks = FakeLayers()
    processes = FakeProcesses()

    def __init__(self) -> None:
        # Operation name -> what its next calls do, in turn: raise the exception, or (None)
        # work. An operation with no list left works.
        self.fail: dict[str, list[BaseException | None]] = {}
        self.calls: list[str] = []
        self.capabilities = CAPABILITIES
        # (short_pause, overwrite) of each live snapshot asked of it, in turn.
        self.saves: list[tuple[bool, bool]] = []

    def _call(self, operation: str) -> None:
        self.calls.append(operation)
        planned = self.fail.get(operation)
        if planned:
            exc = planned.pop(0)
            if exc is not None:
                raise exc

    def identity(self) -> str:
        return "fake-vmm-1"

    def boot(self, paths: VMPaths, kernel: KernelSpec, disk: Path, memory_file: Path | None,
             shape: MachineShape, *, netns: str | None = None) -> VMProcess:
        self._call("boot")
        if memory_file is not None:
            _write_json(memory_file, {"memory_mb": shape.memory_mb})
        paths.agent_socket.unlink(missing_ok=True)
        return self._spawn(paths, disk)

    async def save(self, vm: VMProcess, device_state: Path) -> None:
        self._call("save")
        _write_json(device_state, {"saved_from": vm.pid})

    async def announce_volumes(self, vm: VMProcess, sizes: object) -> None:
        self._call("announce_volumes")

    async def restore(self, paths: VMPaths, snapshot: SnapshotFiles, disk: Path, *,
                      netns: str | None = None, hugetlb: bool = False,
                      volumes: object = None) -> VMProcess:
        self._call("restore")
        if not snapshot.device_state.exists() or not disk.exists():
            raise VMMError(f"nothing to restore from {snapshot.device_state} with {disk}")
        paths.agent_socket.unlink(missing_ok=True)
        vm = self._spawn(paths, disk)
        try:
            vm.agent_connection = await connect_unix(paths.agent_socket, alive=vm.is_alive,
                                                     timeout=START_TIMEOUT_S)
        except BaseException:
            vm.kill()
            raise
        return vm

    async def pause(self, vm: VMProcess) -> None:
        self._call("pause")
        os.kill(vm.pid, signal.SIGSTOP)

    async def resume(self, vm: VMProcess) -> None:
        self._call("resume")
        os.kill(vm.pid, signal.SIGCONT)

    async def snapshot_live(self, vm: VMProcess, stream: Path, new_top: Path, *,
                            short_pause: bool = False, overwrite: bool = False
                            ) -> SnapshotPause:
        self.saves.append((short_pause, overwrite))
        # Half a stream first, as a save that fails midway leaves one.
        stream.write_bytes(b"partial")
        self._call("snapshot_live")
        if not new_top.exists():
            raise VMMError(f"no layer {new_top} to move the disk onto")
        data = json.dumps({"from": vm.pid, "disk": str(new_top)}).encode()
        stream.write_bytes(data)
        return SnapshotPause(0.1, "stopped", len(data))

    async def save_stopped(self, vm: VMProcess, stream: Path) -> None:
        self._call("save_stopped")
        _write_json(stream, {"from": vm.pid})

    async def resize_disk(self, vm: VMProcess, size_bytes: int) -> None:
        self._call("resize_disk")

    # No live migration (not in its capabilities, so the runtime never asks): a real VMM's
    # stream is needed (tests/host/runtime/test_runtime_migration.py).

    async def start_incoming(self, paths: VMPaths, kernel: KernelSpec, shape: MachineShape,
                             disk: Path, *, netns: str | None = None,
                             saved_by: str = "") -> VMProcess:
        self._call("start_incoming")
        raise VMMError("the fake VMM does not migrate")

    async def accept_incoming(self, vm: VMProcess, sock_fd: int) -> None:
        raise VMMError("the fake VMM does not migrate")

    async def wait_incoming(self, vm: VMProcess, timeout: float) -> None:
        raise VMMError("the fake VMM does not migrate")

    async def finish_incoming(self, vm: VMProcess) -> None:
        raise VMMError("the fake VMM does not migrate")

    async def migrate_out(self, vm: VMProcess, sock_fd: int, *, converge_s: float,
                          timeout: float) -> MigrationStats:
        self._call("migrate_out")
        raise VMMError("the fake VMM does not migrate")

    async def settle(self, vm: VMProcess, running: bool) -> None:
        self._call("settle")
        os.kill(vm.pid, signal.SIGCONT if running else signal.SIGSTOP)

    async def resume_source(self, vm: VMProcess) -> None:
        self._call("resume_source")

    def owns(self, pid: int, paths: VMPaths) -> bool:
        argv = read_cmdline(pid)
        return MARK in argv and str(paths.agent_socket) in argv

    def _spawn(self, paths: VMPaths, disk: Path) -> VMProcess:
        paths.workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-c", SERVE, MARK, "--workdir", str(paths.workdir),
                "--agent-socket", str(paths.agent_socket), "--disk", str(disk)]
        with open(paths.vmm_log, "ab") as log:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     cwd=paths.workdir, start_new_session=True)
        return VMProcess(popen.pid, paths, popen)


def lookalike(*args: str) -> subprocess.Popen[bytes]:
    """A process (a sleeping shell) whose command line is MARK followed by `args`: what the
    fake VMM's recogniser takes for a VMM, without one running."""
    proc = subprocess.Popen(["fake-vmm-lookalike", "-c", "sleep 300; true", MARK, *args],
                            executable="/bin/sh")
    # The exec completes in the kernel a moment after Popen returns (the close-on-exec pipe
    # Popen waits for closes before the new command line is in place).
    deadline = time.monotonic() + 5
    while MARK not in read_cmdline(proc.pid):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return proc


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value))


def _make(config: HostConfig, kernel: KernelSpec, reports_free_pages: bool) -> FakeDriver:
    return FakeDriver()


factory.register(NAME, factory.DriverKind(_make, FakeProcesses()))
