"""`SandboxHandle`: one live sandbox, its VMM process and its agent channel.

The agent connection is (re)opened on demand: after a host restart, or after the guest sent
garbage and the old connection was declared broken, the next call reconnects and resyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pandastack.guestproto.ops import ENTROPY_BYTES
from pandastack.host.agentlink.bound import AgentCall, AgentStream, add_listings
from pandastack.host.agentlink.client import (
    DEFAULT_MAX_OUTPUT,
    AgentClient,
    DroppedCallback,
    PidCallback,
)
from pandastack.host.agentlink.failures import note_failure
from pandastack.host.agentlink.handshake import InitParams
from pandastack.host.vmm.driver import VMProcess
from pandastack.hostport.errors import AgentConnectionError, SandboxStateError, VMExited
from pandastack.hostport.protocols import GuestListings, SandboxPort
from pandastack.hostport.results import ExecResult
from pandastack.rules import DEFAULT_TEMPLATE
from pandastack.tracing import traced

log = logging.getLogger(__name__)

OutputCallback = Callable[[bytes], Awaitable[None] | None]


Waker = Callable[[str], Awaitable[None]]

# A VMM whose guest panicked closes the agent channel while it exits: how long to wait for the
# process to end before blaming the channel alone.
EXIT_GRACE_S = 1.0

# The guest sets its clock to the time the host wrote into `init`, whenever it gets to read it:
# a guest slow to run (TCG under load: a forked child's first init took 1.8-3.3 s) was that far
# behind. An init answered later than this is sent again, with the time of its sending, until
# one answers within it (the error is at most that round trip), a bounded number of times.
CLOCK_ROUND_TRIP_S = 0.25
CLOCK_RETRIES = 3


# The guest's listings are methods `add_listings` sets below: type checkers see them, with the
# port's signatures, through the port's protocol of them as a base (not one at run time; mypy
# takes them for abstract, so a handle is made with `ignore[abstract]`).
if TYPE_CHECKING:
    _Listings = GuestListings
else:
    _Listings = object


class SandboxHandle(_Listings):
    """`state` is "running", "paused", "hibernated" (then there is no VM process: the next
    guest operation wakes it through `waker`) or "stopped" (its VM died; a wake boots it)."""

    def __init__(self, sandbox_id: str, vm: VMProcess | None, workdir: Path, hostname: str,
                 created_at: float, agent_timeout: float, *, template: str = DEFAULT_TEMPLATE,
                 state: str = "running", waker: Waker | None = None,
                 forked_from: str | None = None):
        self.id = sandbox_id
        self.forked_from = forked_from
        self.destroyed = False
        self.vm = vm
        self.workdir = workdir
        self.hostname = hostname
        self.created_at = created_at
        self.template = template
        self.state = state
        self.waker = waker
        self._agent_timeout = agent_timeout
        self._agent: AgentClient | None = None
        self._lock = asyncio.Lock()
        # Serializes lifecycle changes (pause, snapshot, hibernate, wake, kill) of this sandbox.
        self.lifecycle_lock = asyncio.Lock()
        self.ready_ms: float | None = None
        # Called once, when its first command has run: the memory admission's hold on what
        # that command takes is dropped then (host/memory/admission.py).
        self.on_first_command: Callable[[], None] | None = None

    def _ran_a_command(self) -> None:
        done, self.on_first_command = self.on_first_command, None
        if done is not None:
            done()

    def __repr__(self) -> str:
        return f"<SandboxHandle {self.id} {self.state} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        return self.vm.pid if self.vm is not None else None

    def is_alive(self) -> bool:
        return self.vm is not None and self.vm.is_alive()

    @traced("guest.handshake")
    async def initialize(self, machine_id: str) -> None:
        """First contact after restore: fresh clock, entropy, hostname and machine-id."""
        if self.vm is None:
            raise SandboxStateError(f"sandbox {self.id} has no VM to initialize")
        started = time.monotonic()
        params = InitParams(time.time_ns(), os.urandom(ENTROPY_BYTES), self.hostname, machine_id)
        vm = self.vm
        early, vm.agent_connection = vm.agent_connection, None
        try:
            if early is not None:
                async with self._lock:
                    self._agent = await AgentClient.from_socket(
                        early, timeout=self._agent_timeout, init=params)
            else:
                agent = await self.agent()
                await agent.init(time_ns=params.time_ns, entropy=params.entropy,
                                 hostname=params.hostname, machine_id=params.machine_id)
        except AgentConnectionError as exc:
            ended = await _vm_ended(vm)
            if ended is None:
                raise
            raise AgentConnectionError(f"{exc} ({ended})") from exc
        self.ready_ms = (time.monotonic() - started) * 1000
        if self.ready_ms > CLOCK_ROUND_TRIP_S * 1000:
            await self.resync_clock(machine_id)

    async def resync_clock(self, machine_id: str) -> None:
        """After its guest stood stopped (a save, a pause) or took long to apply its first
        `init`: its clock stood still with it (under TCG the guest's TSC stops with the VM,
        ~0.1-0.15 s behind per save here), so it is set again, by the same `init` a restore
        sends (hostname and machine-id unchanged), until one answers within
        CLOCK_ROUND_TRIP_S. Best effort: it runs after the save or resume has happened, which
        must not then look failed (a snapshot's id would be lost); an agent out of reach fails
        its next call."""
        try:
            agent = await self.agent()
            for _ in range(CLOCK_RETRIES):
                sent = time.monotonic()
                await agent.init(time_ns=time.time_ns(), entropy=os.urandom(ENTROPY_BYTES),
                                 hostname=self.hostname, machine_id=machine_id)
                if time.monotonic() - sent <= CLOCK_ROUND_TRIP_S:
                    return
            log.warning("sandbox %s: its clock may be off by up to %.2f s (slow init answers)",
                        self.id, time.monotonic() - sent)
        except Exception as exc:  # logged; a cancellation (BaseException) still propagates
            log.warning("sandbox %s: clock not set again after its guest stood still: %s",
                        self.id, exc)

    async def agent(self) -> AgentClient:
        if self.state == "hibernated":
            if self.waker is None:
                raise SandboxStateError(f"sandbox {self.id} is hibernated")
            await self.waker(self.id)
        if self.state == "paused":
            raise SandboxStateError(f"sandbox {self.id} is paused; resume it first")
        if self.state == "stopped":  # its VM died; only a wake boots it again (ADR 0037)
            raise SandboxStateError(f"sandbox {self.id} is stopped; wake it first")
        if self._agent is not None and not self._agent.broken:
            return self._agent
        async with self._lock:
            if self._agent is not None and not self._agent.broken:
                return self._agent
            if self._agent is not None:
                note_failure("reconnect")
                await self._agent.close()
                self._agent = None
            if self.vm is None or not self.vm.is_alive():
                raise VMExited(f"sandbox {self.id}: its VM process is not running")
            early, self.vm.agent_connection = self.vm.agent_connection, None
            if early is not None:
                self._agent = await AgentClient.from_socket(early, timeout=self._agent_timeout)
            else:
                self._agent = await AgentClient.connect(self.vm.paths.agent_socket,
                                                        timeout=self._agent_timeout)
            return self._agent

    @contextlib.asynccontextmanager
    async def guest_call(self) -> AsyncIterator[None]:
        """Around each guest operation: a channel that fails because the VM process died
        under the call (a killed or crashed VMM closes it) is VMExited, a 409 saying the VM
        died, not a 503 that invites a retry; only a channel found broken before the call
        was told so by agent() alone (bench/chaos.py's QEMU kill met the 503 on 11 of 20
        blows once the call itself saw the close)."""
        try:
            yield
        except AgentConnectionError as exc:
            vm = self.vm
            # A VM this runtime stops on purpose (a kill, a hibernation, a migration) is no
            # death: the call fails as the channel did (a kill's callers, E2B's SDK among
            # them, tell an ended sandbox by that).
            deliberate = self.destroyed or self.lifecycle_lock.locked()
            if isinstance(exc, VMExited) or vm is None or deliberate:
                raise
            ended = await _vm_ended(vm)
            if ended is None:
                raise
            raise VMExited(f"sandbox {self.id}: {ended}") from exc

    async def disconnect(self) -> None:
        if self._agent is not None:
            await self._agent.close()
            self._agent = None

    async def destroy(self) -> None:
        """Kill the VM and remove every file the sandbox had."""
        self.destroyed = True
        await self.disconnect()
        if self.vm is not None:
            await asyncio.to_thread(self.vm.kill)
        await asyncio.to_thread(shutil.rmtree, self.workdir, True)

    # -- guest operations -----------------------------------------------------------------

    @traced("guest.exec")
    async def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   stdin: bytes | None = None, on_stdout: OutputCallback | None = None,
                   on_stderr: OutputCallback | None = None,
                   user: str | None = None, max_output: int | None = None) -> ExecResult:
        try:
            async with self.guest_call():
                agent = await self.agent()
                if max_output is None:
                    return await agent.exec(cmd, timeout=timeout, env=env, cwd=cwd,
                                            stdin=stdin, on_stdout=on_stdout,
                                            on_stderr=on_stderr, user=user)
                return await agent.exec(cmd, timeout=timeout, env=env, cwd=cwd, stdin=stdin,
                                        on_stdout=on_stdout, on_stderr=on_stderr, user=user,
                                        max_output=max_output)
        finally:
            self._ran_a_command()

    async def attach(self, pid: int, *, on_stdout: OutputCallback | None = None,
                     on_stderr: OutputCallback | None = None,
                     on_dropped: DroppedCallback | None = None,
                     keep_output: bool = True) -> ExecResult:
        async with self.guest_call():
            agent = await self.agent()
            if keep_output:
                return await agent.attach(pid, on_stdout=on_stdout, on_stderr=on_stderr,
                                          on_dropped=on_dropped)
            return await agent.attach(pid, on_stdout=on_stdout, on_stderr=on_stderr,
                                      on_dropped=on_dropped, max_output=0)

    async def spawn_attach(self, cmd: str | Sequence[str], *, on_spawned: PidCallback,
                           env: Mapping[str, str] | None = None, cwd: str | None = None,
                           user: str | None = None, timeout: float | None = None,
                           stdin: bool = True, on_stdout: OutputCallback | None = None,
                           on_stderr: OutputCallback | None = None,
                           keep_output: bool = True) -> ExecResult:
        try:
            async with self.guest_call():
                agent = await self.agent()
                return await agent.spawn_attach(
                    cmd, on_spawned=on_spawned, env=env, cwd=cwd, user=user, timeout=timeout,
                    stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                    max_output=DEFAULT_MAX_OUTPUT if keep_output else 0)
        finally:
            self._ran_a_command()

    # The rest are the agent client's own, called on `agent()` (bound.py): one name each.
    spawn = AgentCall(AgentClient.spawn)
    procs = AgentCall(AgentClient.procs)
    signal = AgentCall(AgentClient.signal)
    send_stdin = AgentCall(AgentClient.send_stdin)
    pty_create = AgentCall(AgentClient.pty_create)
    pty_connect = AgentCall(AgentClient.pty_connect)
    read_file = AgentStream(AgentClient.read_file)
    read_file_bytes = AgentCall(AgentClient.read_file_bytes)
    write_file = AgentCall(AgentClient.write_file)
    list_dir = AgentCall(AgentClient.list_dir)
    stat = AgentCall(AgentClient.stat)
    mkdir = AgentCall(AgentClient.mkdir)
    remove = AgentCall(AgentClient.remove)
    rename = AgentCall(AgentClient.rename)
    watch = AgentStream(AgentClient.watch)
    metrics = AgentCall(AgentClient.metrics)

    # -- code interpreter (agentlink/code.py) -----------------------------------------------
    run_code = AgentStream(AgentClient.run_code)
    create_code_context = AgentCall(AgentClient.create_code_context)
    list_code_contexts = AgentCall(AgentClient.list_code_contexts)
    delete_code_context = AgentCall(AgentClient.delete_code_context)
    restart_code_context = AgentCall(AgentClient.restart_code_context)


add_listings(SandboxHandle, SandboxPort)  # type: ignore[type-abstract]


async def _vm_ended(vm: VMProcess) -> str | None:
    """None while the VM process runs (after a short grace); else how it ended, with the last
    words of the guest console (a restored guest that panics ends its VMM process: drivers
    run VMs without reboot)."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while vm.is_alive():
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.02)
    status = vm.exit_status()
    said = f"the VM exited with status {status}" if status is not None else "the VM exited"
    last = await asyncio.to_thread(_console_last_words, vm.paths.console_log)
    return f"{said}; guest console: {last}" if last else said


def _console_last_words(path: Path, tail: int = 8192) -> str:
    """The guest console's kernel panic line if it has one near its end, else its last line."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    panics = [ln for ln in lines if "Kernel panic" in ln]
    return (panics or lines or [""])[-1][:200]
