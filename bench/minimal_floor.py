"""Create -> first exec against a minimal-VM floor (issue 36, target 2), with the product's
time split by phase beside the floor's, and the floor's guest taught our guest's habits one
at a time, so that the gap is attributed by measurement.

The floor is a minimal hand-made guest restored by bare QEMU: our guest kernel (the base
template's, with its command line), an initramfs of busybox-static whose /init loads our
initramfs's modules, mounts the base template's disk read-only and execs a static C agent
(bench/minimal_floor_agent.c) that chroots into it and, per byte on its virtio-serial port,
forks and execs the disk's `/bin/sh -c true` and answers the exit status. Devices: a console,
the virtio-serial channel and the root disk; no network, no `init` message, no jail. Same QEMU
binary, machine, accelerator, CPU and shape as the runtime's driver; RAM saved as ours is (a
shared memory file on tmpfs, left out of the stream with x-ignore-shared, mapped privately by
each restore) so the floor measures the devices and the guest, not a different way to load
memory. Booted once per run (and once more for each variant below that needs its own
machine), warmed with a few requests, settled, saved.

Timed in the same run, in rounds (one warm-up round left out), each round every variant in
turn, so that load drifts hit all alike:
- the floor: QEMU started with `-incoming defer` -> agent socket connected -> QMP
  x-ignore-shared + migrate-incoming (one write, as our driver does) -> one request -> answer;
  variants: only an answer (the resume's cost), the parts of our `init` alone (clock, entropy
  and reseed, hostname), our device model's NIC and volume slots, the command entered into a
  cgroup leaf as our agent does it, and that with cgroup2's `favordynmods`;
- the driver floor (bench/create.py's `floor_once`): our snapshot restored by our driver
  (jail, our device model, our agent, a prepared network namespace), hello and exec through
  raw frames; variant: with an `init` in the same write;
- the product: `rt.create("base")` then `exec(["/bin/sh", "-c", "true"])`, in process, with
  the runtime's spans recorded (src/pandastack/tracing.py) to split its time by phase;
  variant: the VMM's cgroup join in a thread (what taking it off the path would gain);
- with `--sdk` (the default; `--no-sdk` leaves it out), the product end to end (issue 36,
  target 3): a real `pandastack serve` started as bench/api.py starts it (`live_server`:
  free loopback port, private state, temporary database), and through one long-lived SDK
  `Client` (its pool open after the warm-up round, bench/api.py's `pooled_once`) a create
  then `exec` of the same argv; the kill is not timed.

The built initramfs is cached under PANDASTACK_BENCH_CACHE (default
/var/lib/pandastack/bench-cache), keyed by what goes into it; the snapshots live on /dev/shm
for the run only. Refuses to run while /tmp/pandastack-quiet exists.

Usage: python bench/minimal_floor.py [--n 20] [--no-sdk]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api import kill_everything, live_server, pooled_once
from common import line, pct, temp_runtime
from create import floor_once as driver_floor_once
from create import init_frame
from pandastack import Client, tracing
from pandastack.host.images.initramfs import CpioWriter, initramfs_module_order, read_cpio
from pandastack.host.network.manager import GUEST_MAC
from pandastack.host.runtime import HostRuntime
from pandastack.host.templates.builtin import Template
from pandastack.host.vmm.driver import VMPaths, connect_unix
from pandastack.host.vmm.qemu import jail
from pandastack.host.vmm.qemu.command import volume_slot_args
from pandastack.host.vmm.qemu.driver import QemuDriver
from pandastack.host.vmm.qemu.qmp import connect_qmp, qmp_pipeline, wait_migration

RECIPE = "1"  # bump when the guest's layout changes
CACHE = Path(os.environ.get("PANDASTACK_BENCH_CACHE", "/var/lib/pandastack/bench-cache"))
AGENT_SOURCE = Path(__file__).with_name("minimal_floor_agent.c")
BUSYBOX = Path("/bin/busybox")  # busybox-static (scripts/host-deps.sh)
PORT_NAME = "floor"
VOLUME_SLOTS = 4  # of the `ours` device model, as the driver's default
BOOT_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 30.0
WARM_REQUESTS = 10  # the shell, libc and the exec path in the guest's page cache, as our warm-up
SETTLE_S = 1.0  # as the templates' bake

INIT = f"""#!/bin/sh
/bin/busybox --install -s /bin
fail() {{ echo "FLOOR_INIT_ERROR: $*" > /dev/console; poweroff -f; }}
mount -t proc proc /proc || fail proc
mount -t sysfs sysfs /sys || fail sysfs
mount -t devtmpfs devtmpfs /dev || fail devtmpfs
while read -r ko; do insmod "/lib/modules/$ko" || fail "insmod $ko"; done < /etc/floor-modules
# Only where the machine has our device model's NIC: its link up, as our guest's is.
[ -e /sys/class/net/eth0 ] && ip link set eth0 up
port=
i=0
while [ -z "$port" ] || [ ! -c "$port" ] || [ ! -b /dev/vda ]; do
\ti=$((i + 1)); [ "$i" -le 400 ] || fail "no /dev/vda or no port {PORT_NAME}"
\tfor p in /sys/class/virtio-ports/*; do
\t\t[ "$(cat "$p/name" 2>/dev/null)" = {PORT_NAME} ] && port="/dev/${{p##*/}}"
\tdone
\tsleep 0.05
done
mount -t ext4 -o ro,noload /dev/vda /newroot || fail "mount /dev/vda"
# cgroup2 as our guest mounts it (pandastack-init.sh), or with favordynmods where the command
# line asks, and one leaf for the agent's 'g' requests.
opts=nsdelegate
grep -q floor.favordynmods /proc/cmdline && opts=nsdelegate,favordynmods
mount -t sysfs sysfs /newroot/sys || fail "sysfs in the root"
mount -t cgroup2 -o "$opts" cgroup2 /newroot/sys/fs/cgroup || fail "cgroup2 $opts"
echo +pids > /newroot/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /newroot/sys/fs/cgroup/floor/leaf || fail "cgroup leaf"
echo +pids > /newroot/sys/fs/cgroup/floor/cgroup.subtree_control
exec /agent "$port" /newroot
"""


def log(message: str) -> None:
    print(message, flush=True)


# -- the guest ------------------------------------------------------------------------------


def our_modules(initrd: Path) -> list[tuple[str, bytes]]:
    """The modules our initramfs loads, in its order (the NIC's driver too: a driver with no
    device costs nothing, and so both device models boot the same initramfs)."""
    entries = {e.name: e.data for e in read_cpio(gzip.decompress(initrd.read_bytes()))}
    return [(name, entries[f"lib/modules/{name}"]) for name in initramfs_module_order(initrd)]


def build_initrd(our_initrd: Path) -> Path:
    """The floor's initramfs, built once per content (agent source, busybox, modules)."""
    modules = our_modules(our_initrd)
    key = hashlib.sha256(b"\0".join([
        RECIPE.encode(), INIT.encode(), AGENT_SOURCE.read_bytes(),
        hashlib.sha256(BUSYBOX.read_bytes()).digest(), *(n.encode() + d for n, d in modules),
    ])).hexdigest()[:20]
    out = CACHE / "minimal-floor" / key / "initrd.img"
    if out.exists():
        return out
    log(f"building the floor's initramfs in {out.parent}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        agent = Path(tmp) / "agent"
        subprocess.run(["gcc", "-static", "-O2", "-s", "-Wall", "-Werror", "-o", str(agent),
                        str(AGENT_SOURCE)], check=True)
        w = CpioWriter()
        for d in ("bin", "dev", "etc", "lib", "lib/modules", "newroot", "proc", "sys"):
            w.dir(d)
        w.chardev("dev/console", 5, 1)
        w.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
        w.symlink("bin/sh", "busybox")
        w.file("init", INIT.encode(), 0o755)
        w.file("agent", agent.read_bytes(), 0o755)
        for name, data in modules:
            w.file(f"lib/modules/{name}", data)
        w.file("etc/floor-modules", "".join(f"{n}\n" for n, _ in modules).encode())
        partial = Path(tmp) / "initrd.img"
        partial.write_bytes(gzip.compress(w.getvalue(), compresslevel=6, mtime=0))
        os.replace(partial, out)
    return out


@dataclass(frozen=True)
class Floor:
    """The minimal guest's saved state and how to start a QEMU for it."""

    driver: QemuDriver
    tmpl: Template
    initrd: Path
    memory: Path  # on tmpfs: the RAM file the boot shared and each restore maps privately
    device_state: Path
    # Our device model's other devices too: the NIC (on a QEMU hub with no other port, so
    # no traffic leaves) and the empty volume slots.
    our_devices: bool = False
    cmdline_extra: str = ""

    def argv(self, workdir: Path, *, share: bool) -> list[str]:
        shape, kernel = self.tmpl.snapshot.shape, self.tmpl.snapshot.kernel
        d = self.driver
        accel = "kvm" if d.accel == "kvm" else f"tcg,tb-size={d.tb_size_mb}"
        return [
            d.binary, "-name", "pandastack-minimal-floor",
            "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
            "-accel", accel, "-cpu", d.cpu,
            "-object", f"memory-backend-file,id=ram,size={shape.memory_mb}M,"
                       f"mem-path={self.memory},share={'on' if share else 'off'}",
            "-M", d.machine_for(self.tmpl.snapshot.saved_by),
            "-m", f"{shape.memory_mb}M", "-smp", str(shape.vcpus),
            "-kernel", str(kernel.kernel), "-initrd", str(self.initrd),
            "-append", f"{kernel.cmdline} {self.cmdline_extra}".strip(),
            "-chardev", f"file,id=console,path={workdir / 'console.log'},append=on",
            "-serial", "chardev:console",
            # Our template's disk, read-only: nothing is written, so no overlay is needed.
            "-drive", f"id=root,file={self.tmpl.disk},format=qcow2,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=root",
            "-device", "virtio-serial-device,max_ports=2",
            "-chardev", f"socket,id=agent,path={workdir / 'agent.sock'},server=on,wait=off",
            "-device", f"virtserialport,chardev=agent,name={PORT_NAME}",
            "-chardev", f"socket,id=qmp,path={workdir / 'qmp.sock'},server=on,wait=off",
            "-mon", "chardev=qmp,mode=control",
            *(self.device_args(workdir) if self.our_devices else ()),
            "-global", "migration.store-global-state=off",
            "-global", "migration.announce-rounds=0",
        ]

    def device_args(self, workdir: Path) -> list[str]:
        return ["-netdev", "hubport,id=net0,hubid=0",
                "-device", f"virtio-net-device,netdev=net0,mac={GUEST_MAC}",
                *volume_slot_args(VMPaths(workdir), {}, VOLUME_SLOTS)]


def spawn(argv: list[str], workdir: Path, pass_fds: tuple[int, ...] = ()
          ) -> subprocess.Popen[bytes]:
    with open(workdir / "vmm.log", "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                pass_fds=pass_fds, start_new_session=True)


def request(sock: socket.socket, timeout: float = REPLY_TIMEOUT_S, what: bytes = b"x") -> int:
    """The requests `what` (bench/minimal_floor_agent.c; b"x" one `/bin/sh -c true`) in one
    write: the first non-zero answer, or 0."""
    sock.setblocking(True)
    sock.settimeout(timeout)
    sock.sendall(what)
    answers = b""
    while len(answers) < len(what):
        got = sock.recv(len(what) - len(answers))
        if not got:
            raise RuntimeError("the floor's agent closed its port")
        answers += got
    return next((a for a in answers if a), 0)


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()


async def bake(driver: QemuDriver, tmpl: Template, initrd: Path, root: Path,
               our_devices: bool = False, cmdline_extra: str = "") -> Floor:
    """Boot the minimal guest, warm it, let it settle and save it under `root`."""
    root.mkdir()
    floor = Floor(driver, tmpl, initrd, root / "memory", root / "device.state", our_devices,
                  cmdline_extra)
    workdir = root / "bake"
    workdir.mkdir()
    proc = spawn(floor.argv(workdir, share=True), workdir)
    try:
        sock = await connect_unix(workdir / "agent.sock", alive=lambda: proc.poll() is None)
        started = time.monotonic()
        # The request waits in the socket until the agent opens its port.
        if request(sock, BOOT_TIMEOUT_S) != 0:
            raise RuntimeError("the floor's agent: `/bin/sh -c true` failed at boot")
        log(f"floor guest booted and answered in {time.monotonic() - started:.1f} s")
        for _ in range(WARM_REQUESTS):
            request(sock, what=b"xpg")
        await asyncio.sleep(SETTLE_S)
        qmp = await connect_qmp(workdir / "qmp.sock")
        try:
            await qmp.execute("stop")
            await qmp.execute("migrate-set-capabilities", {"capabilities": [
                {"capability": "x-ignore-shared", "state": True}]})
            await qmp.execute("migrate", {"uri": f"exec:cat > {floor.device_state}"})
            await wait_migration(qmp)
        finally:
            await qmp.disconnect()
        sock.close()
    except BaseException:
        log(f"floor boot failed; console: {(workdir / 'console.log').read_text()[-2000:]!r}")
        raise
    finally:
        kill(proc)
    return floor


async def floor_once(floor: Floor, workdir: Path, what: bytes = b"x") -> dict[str, float]:
    """Restore -> first answer, ms, split: QEMU up (its sockets), state loaded, answered."""
    workdir.mkdir()
    fd = os.open(floor.device_state, os.O_RDONLY | os.O_CLOEXEC)
    started = time.perf_counter()
    proc = spawn([*floor.argv(workdir, share=False), "-incoming", "defer"], workdir, (fd,))
    try:
        def alive() -> bool:
            return proc.poll() is None
        # As our driver: the agent's socket connected before the guest runs, then one QMP write.
        sock = await connect_unix(workdir / "agent.sock", alive=alive)
        up = time.perf_counter()
        await qmp_pipeline(workdir / "qmp.sock", [
            ("migrate-set-capabilities", {"capabilities": [
                {"capability": "x-ignore-shared", "state": True}]}),
            ("migrate-incoming", {"uri": f"fd:{fd}"}),
        ], alive=alive)
        loaded = time.perf_counter()
        if request(sock, what=what) != 0:
            raise RuntimeError(f"the floor's requests {what!r} failed")
        done = time.perf_counter()
        sock.close()
    finally:
        os.close(fd)
        kill(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"total": (done - started) * 1000, "qemu up": (up - started) * 1000,
            "state loaded": (loaded - up) * 1000, "guest answers": (done - loaded) * 1000}


# -- the product, by phase ------------------------------------------------------------------

# The runtime's spans on create -> first exec (tracing.py), as (label, span, its parent span).
PHASES = (
    ("network slot (a spare)", "runtime.network_slot", "runtime.create"),
    ("overlay", "runtime.overlay", "runtime.create"),
    ("jail dir + cgroup made", "vmm.jail", "vmm.restore"),
    ("QEMU spawn (fork+exec)", "vmm.spawn", "vmm.restore"),
    ("QEMU joins its cgroup", "vmm.cgroup_join", "vmm.restore"),
    ("QEMU up + QMP load", "vmm.qmp_restore", "vmm.restore"),
    ("handshake (resume, hello, init)", "guest.handshake", "runtime.create"),
    ("first exec", "guest.exec", None),
)


async def product_once(rt: HostRuntime, exporter: InMemorySpanExporter,
                       join_in_thread: bool = False) -> dict[str, float]:
    exporter.clear()
    started = time.perf_counter()
    JOIN_IN_THREAD[0] = join_in_thread
    try:
        sbx = await rt.create("base")
    finally:
        JOIN_IN_THREAD[0] = False
    result = await sbx.exec(["/bin/sh", "-c", "true"])
    total = (time.perf_counter() - started) * 1000
    assert result.exit_code == 0, result
    await rt.kill(sbx.id)
    spans: dict[str, list[ReadableSpan]] = defaultdict(list)
    for s in exporter.get_finished_spans():
        spans[s.name].append(s)

    def ms(name: str) -> float:
        return sum(((s.end_time or 0) - (s.start_time or 0)) / 1e6 for s in spans[name])

    times = {"total": total}
    for label, name, _ in PHASES:
        times[label] = ms(name)
    # What the agent reports: from its start of the process to the process's exit.
    times["  of which the command, agent-timed"] = result.duration_ms
    times["restore, rest (argv, files)"] = (
        ms("vmm.restore") - ms("vmm.jail") - ms("vmm.spawn") - ms("vmm.cgroup_join")
        - ms("vmm.qmp_restore"))
    accounted = ms("vmm.restore") + sum(times[label] for label, _, parent in PHASES
                                        if parent in ("runtime.create", None))
    times["the rest (bookkeeping, files)"] = total - accounted
    return times


async def quiesce(rt: HostRuntime) -> None:
    """Let the spare network slot the last create consumed be remade before the next timing
    (its `ip` and `nft` runs would otherwise load whichever side comes next)."""
    refill = getattr(rt.slots, "_refill", None)
    if refill is not None and not refill.done():
        await refill
    await asyncio.sleep(0.2)


# -- the run --------------------------------------------------------------------------------


SH_TRUE = ["/bin/sh", "-c", "true"]


# Whether the next create's cgroup join goes to a thread and the restore goes on meanwhile:
# what it would gain if the driver did it while QEMU starts (it is not waited for here, so
# QEMU may map some memory before it is in its cgroup: a measurement, not a proposal as is).
JOIN_IN_THREAD = [False]


@contextmanager
def cgroup_join_traced() -> Iterator[None]:
    """The jail's cgroup join (after QEMU's spawn, outside the driver's spans) as a span of
    its own, for this run only: the driver calls `jail.enter` through its module."""
    plain = jail.enter

    def enter(cell: jail.Jail, pid: int) -> None:
        with tracing.span("vmm.cgroup_join"):
            if JOIN_IN_THREAD[0]:
                threading.Thread(target=plain, args=(cell, pid), daemon=True).start()
            else:
                plain(cell, pid)

    jail.enter = enter  # type: ignore[assignment]
    try:
        yield
    finally:
        jail.enter = plain


async def run(n: int, sdk: bool) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with temp_runtime("minimal-floor-") as (rt, scratch):
        driver = rt.driver
        if not isinstance(driver, QemuDriver):
            raise SystemExit(f"needs the QEMU driver, not {driver.name}")
        tmpl = await rt.ensure_template("base")
        initrd = build_initrd(tmpl.snapshot.kernel.initrd)
        shm = Path(tempfile.mkdtemp(prefix="pandastack-minimal-floor-", dir="/dev/shm"))
        stack = contextlib.ExitStack()
        try:
            floor = await bake(driver, tmpl, initrd, shm / "minimal")
            devices = await bake(driver, tmpl, initrd, shm / "devices", our_devices=True)
            dynmods = await bake(driver, tmpl, initrd, shm / "dynmods",
                                 cmdline_extra="floor.favordynmods")
            scratch.mkdir(parents=True, exist_ok=True)
            client = start_sdk(stack, scratch / "serve") if sdk else None
            rounds = 0

            def workdir(name: str) -> Path:
                return scratch / f"{name}-{rounds}"

            # Each of a round's timings, in this order; drift hits all alike.
            variants: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
                FLOOR: lambda: floor_once(floor, workdir("floor")),
                "  resume + answer, no exec": lambda: floor_once(floor, workdir("ping"), b"p"),
                "  resume + clock set 1 h on": lambda: floor_once(floor, workdir("c"), b"c"),
                "  resume + entropy, reseed": lambda: floor_once(floor, workdir("r"), b"r"),
                "  resume + hostname": lambda: floor_once(floor, workdir("h"), b"h"),
                "  resume + the three": lambda: floor_once(floor, workdir("crh"), b"crh"),
                "  + our NIC and 4 volume slots": lambda: floor_once(devices, workdir("dev")),
                "  exec in a cgroup leaf (as ours)": lambda: floor_once(floor, workdir("g"), b"g"),
                "  the same, cgroup2 favordynmods": lambda: floor_once(dynmods, workdir("G"),
                                                                       b"g"),
                DRIVER: lambda: driver_floor(rt, tmpl, workdir("driver")),
                "  + init in the same write": lambda: driver_floor(rt, tmpl, workdir("init"),
                                                                   init_frame()),
                PRODUCT: lambda: product_once(rt, exporter),
                "  cgroup join off the path (a test)": lambda: product_once(
                    rt, exporter, join_in_thread=True),
            }
            if client is not None:
                variants[SDK] = lambda: sdk_once(client)
            times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            failed: dict[str, int] = defaultdict(int)
            tracing.use(provider)
            with cgroup_join_traced():
                for rounds in range(n + 1):  # round 0 warms every side: page cache, pools
                    for name, once in variants.items():
                        try:
                            measured = await once()
                        except Exception as exc:  # a shared machine's spike: count it, go on
                            log(f"round {rounds}, {name.strip()}: failed: {exc!r}")
                            failed[name] += 1
                            continue
                        finally:
                            await quiesce(rt)
                        if rounds:
                            for label, value in measured.items():
                                times[name][label].append(value)
        finally:
            tracing.use(None)
            stack.close()
            shutil.rmtree(shm, ignore_errors=True)
    report(times, failed, driver)


async def driver_floor(rt: HostRuntime, tmpl: Template, workdir: Path,
                       extra: bytes = b"") -> dict[str, float]:
    return {"total": 1000 * await driver_floor_once(rt, tmpl, workdir, extra, argv=SH_TRUE)}


def start_sdk(stack: contextlib.ExitStack, tmp: Path) -> Client:
    """`pandastack serve` on private state under `tmp` and a pooled SDK client of it, both
    closed by `stack` (whatever sandbox an error left live killed first, then the server
    stopped and any VM of its left killed)."""
    tmp.mkdir()
    server = stack.enter_context(live_server(tmp))
    stack.callback(kill_everything, server)
    log(f"pandastack serve up at {server.api_url}")
    return stack.enter_context(Client(server.api_url, server.api_key))


async def sdk_once(client: Client) -> dict[str, float]:
    # Blocking, as a user's program is: this process's runtime is idle meanwhile (quiesced).
    # The server remakes the spare network slot its create took (~20 ms of `ip` and `nft`,
    # host/runtime/slots.py) while the exec goes on; quiesce's pause follows the kill too.
    created, done = pooled_once(client, SH_TRUE)
    return {"total": done * 1000, "create": created * 1000, "first exec": (done - created) * 1000}


FLOOR = "minimal-VM floor (bare QEMU)"
DRIVER = "driver floor (ours, hello+exec)"
PRODUCT = "product (rt.create + exec)"
SDK = "SDK through serve (create + exec)"


def report(times: dict[str, dict[str, list[float]]], failed: dict[str, int],
           driver: QemuDriver) -> None:
    f50 = pct(times[FLOOR]["total"], 50)
    load = os.getloadavg()
    print(f"\n{driver.accel}, {driver.cpu}, {driver.machine()}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} after the run")
    print("create -> first exec of /bin/sh -c true (p50/p99 ratios to the floor's p50):")
    for name, measured in times.items():
        values = measured["total"]
        print(f"{line(name, values, width=36)}  {pct(values, 50) / f50:.2f}x "
              f"{pct(values, 99) / f50:.2f}x" + (f"  ({failed[name]} failed)"
                                                 if failed[name] else ""))
    print("\nfloor by phase (p50 ms):")
    for label in ("qemu up", "state loaded", "guest answers"):
        print(f"  {label:40s} {pct(times[FLOOR][label], 50):7.1f}")
    print("product by phase (p50 ms; the runtime's spans, src/pandastack/tracing.py):")
    product = times[PRODUCT]
    for label, values in product.items():
        if label != "total":
            print(f"  {label:40s} {pct(values, 50):7.1f}")
    print(f"  {'(sum of the p50s)':40s} "
          f"{sum(pct(v, 50) for k, v in product.items() if k[0] != ' ' and k != 'total'):7.1f}")
    sdk = times.get(SDK)
    if sdk:
        print("SDK through serve by call (p50 ms):")
        for label in ("create", "first exec"):
            print(f"  {label:40s} {pct(sdk[label], 50):7.1f}")
        s50, s99 = pct(sdk["total"], 50), pct(sdk["total"], 99)
        print(f"\ntarget 3: SDK create -> first exec <= 1.15x the static-agent floor: "
              f"{s50 / f50:.2f}x at p50, {s99 / f50:.2f}x at p99 "
              f"({'met' if s50 <= 1.15 * f50 else 'not met'} at p50)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--sdk", action=argparse.BooleanOptionalAction, default=True,
                        help="also time SDK create -> first exec through a real "
                             "`pandastack serve` (target 3; default on)")
    args = parser.parse_args()
    if Path("/tmp/pandastack-quiet").exists():
        print("/tmp/pandastack-quiet exists: a timing CI run is on; not running", file=sys.stderr)
        return 1
    asyncio.run(run(args.n, args.sdk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
