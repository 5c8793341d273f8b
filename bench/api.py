"""What the REST API and the SDK add to creating a sandbox, measured against the host runtime
in the same run.

- **API**: a real `pandastack serve` subprocess (private state dir, temporary database and
  client config, free loopback port: the way `tests/e2e/conftest.py` starts it). Timed: the
  SDK's `Sandbox.create(template="base")` then `sbx.exec(...)` until its result is back, the
  way a user's calls go (`Sandbox.create` uses the process's shared connection pool for the
  server, sdk/_shared_http.py: after the untimed warm-up round it is open, as in any program
  past its first create). The kill is not timed. The same through one long-lived `Client` is
  measured too (its own pool): the two should agree.
- **Runtime**: `HostRuntime` in this process, on its own private state dir. Timed:
  `create("base")` then `exec(..., timeout=60)` (the timeout the SDK sends by default, which
  the API passes on to the guest: both sides make the same guest call). The kill is not timed.
- **Agent** (with `--agent`): a real `pandastack agent` subprocess on a unix socket (private
  state dir and token file), driven by one long-lived `HostClient`, the way the control
  plane reaches a separate agent. Timed as the runtime is. Compared with the runtime, it is
  what the host API hop adds (target: <= 5 ms at p50).
- **API over the agent** (with `--agent` and the API): a second `pandastack serve`, started
  with `--agent` on that agent, timed like the pooled API side: the remote-agent column of
  the REST API, against the pooled API with its runtime in-process.

Both run the same command (`true` as an argv by default, `--shell` for the string `"true"`,
which goes through `/bin/sh -c` in the guest). The two sides alternate, iteration by
iteration, with the order flipped every time, so drift hits both alike. One untimed warm-up
round each comes first.

**Warm calls** (`--warm N`, default 40; 0 skips them): one sandbox on each side (the pooled
API's and the runtime's), each kept for all of them; then, per call, 5 untimed warm-ups and N
timed calls, alternating between the sides call by call: `exec` of the same command, reading
and writing a 20-byte file, `stat` of it and listing its directory. The API's side is the
SDK's `Client` (one connection pool), the runtime's the sandbox handle in this process; their
p50 difference is what the API adds to each call (target: <= 5 ms).

Usage: python bench/api.py [--n 30] [--warm 40] [--shell] [--agent [--no-api]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common import qemu_pids_under, stop
from pandastack import Client, Sandbox
from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
from pandastack.hostport.protocols import SandboxPort
from pandastack.server.hostclient import HostClient

MAX_N = 1000
# What the SDK's exec sends as its timeout when given none (the server passes it on to the
# guest); the runtime's side passes the same, so both run the same guest call.
SDK_EXEC_TIMEOUT = 60.0
SERVER_START_TIMEOUT = 300.0  # may have to bake the template first


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    api_url: str
    api_key: str


@contextmanager
def live_server(tmp: Path, agent: tuple[str, Path] | None = None,
                extra_env: dict[str, str] | None = None) -> Iterator[Server]:
    """`pandastack serve` on a free loopback port with everything private under `tmp`
    (driving `agent`, its address and token file, when given; `extra_env` over its
    environment). Stopped with SIGTERM (SIGKILL after 30 s); any VM left behind is killed."""
    port = free_port()
    drive = ["--agent", agent[0], "--agent-token-file", str(agent[1])] if agent else []
    env = {
        **os.environ,
        "PANDASTACK_STATE_DIR": str(tmp / "sandboxes"),
        "PANDASTACK_DB": f"sqlite:///{tmp / 'pandastack.db'}",
        "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
        **(extra_env or {}),
    }
    url = f"http://127.0.0.1:{port}"
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port),
             "--log-level", "warning", *drive],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("server did not come up:\n"
                                       + (tmp / "server.log").read_text()[-3000:])
                time.sleep(0.2)
            key = json.loads((tmp / "client.json").read_text())["api_key"]
            yield Server(url, key)
        finally:
            stop(proc, tmp)


@contextmanager
def live_agent(tmp: Path) -> Iterator[HostClient]:
    """`pandastack agent` on a unix socket with everything private under `tmp`, and a
    client of it. Stopped with SIGTERM (SIGKILL after 30 s); any VM left behind is killed."""
    sock, token_file = tmp / "agent.sock", tmp / "agent.token"
    env = {**os.environ, "PANDASTACK_STATE_DIR": str(tmp / "sandboxes")}
    with open(tmp / "agent.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pandastack", "agent", "--listen", f"unix:{sock}",
             "--token-file", str(token_file), "--log-level", "warning"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT
            transport = httpx.HTTPTransport(uds=str(sock))
            with httpx.Client(transport=transport, base_url="http://agent") as probe:
                while True:
                    try:
                        if probe.get("/health", timeout=2).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("agent did not come up:\n"
                                           + (tmp / "agent.log").read_text()[-3000:])
                    time.sleep(0.2)
            yield HostClient(f"unix:{sock}", token_file.read_text().strip())
        finally:
            stop(proc, tmp)


@dataclass
class Side:
    """Timings of one side, in seconds: create alone, and create + first exec."""

    created: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)

    def add(self, created: float, total: float) -> None:
        self.created.append(created)
        self.total.append(total)


def api_once(server: Server, cmd: str | list[str]) -> tuple[float, float]:
    started = time.perf_counter()
    sbx = Sandbox.create(template="base", ttl_seconds=300, api_url=server.api_url,
                         api_key=server.api_key)
    created = time.perf_counter()
    try:
        result = sbx.exec(cmd)
        done = time.perf_counter()
        assert result.exit_code == 0, result
    finally:
        sbx.kill()
        sbx.close()
    return created - started, done - started


def pooled_once(client: Client, cmd: str | list[str]) -> tuple[float, float]:
    """The same through one long-lived `Client` (its connection pool already open)."""
    started = time.perf_counter()
    sbx = client.sandboxes.create(template="base", ttl_seconds=300)
    created = time.perf_counter()
    try:
        result = sbx.exec(cmd)
        done = time.perf_counter()
        assert result.exit_code == 0, result
    finally:
        client.sandboxes.kill(sbx.id)
    return created - started, done - started


async def host_once(host: HostRuntime | HostClient,
                    cmd: str | list[str]) -> tuple[float, float]:
    """The runtime in this process, or an agent through HostClient: the same calls."""
    started = time.perf_counter()
    sbx = await host.create("base")
    created = time.perf_counter()
    try:
        result = await sbx.exec(cmd, timeout=SDK_EXEC_TIMEOUT)
        done = time.perf_counter()
        assert result.exit_code == 0, result
    finally:
        await host.kill(sbx.id)
    return created - started, done - started


WARM_FILE = "/tmp/psa-warm.txt"
WARM_DIR = "/tmp"
WARM_DATA = b"twenty bytes of data"
WARM_UPS = 5
WARM_CALLS = ("exec", "read", "write", "stat", "list")


def api_warm_calls(sbx: Sandbox, cmd: str | list[str]) -> dict[str, Callable[[], object]]:
    """Each warm call through the SDK, checked."""
    def run() -> object:
        result = sbx.exec(cmd)
        assert result.exit_code == 0, result
        return result

    def read() -> object:
        assert sbx.files.read(WARM_FILE) == WARM_DATA
        return None

    return {"exec": run, "read": read,
            "write": lambda: sbx.files.write(WARM_FILE, WARM_DATA),
            "stat": lambda: sbx.files.stat(WARM_FILE),
            "list": lambda: sbx.files.list(WARM_DIR)}


def host_warm_calls(sbx: SandboxPort,
                    cmd: str | list[str]) -> dict[str, Callable[[], Awaitable[object]]]:
    """The same calls on the runtime's handle, in this process."""
    async def run() -> object:
        result = await sbx.exec(cmd, timeout=SDK_EXEC_TIMEOUT)
        assert result.exit_code == 0, result
        return result

    async def read() -> object:
        data = b"".join([chunk async for chunk in sbx.read_file(WARM_FILE)])
        assert data == WARM_DATA
        return None

    return {"exec": run, "read": read,
            "write": lambda: sbx.write_file(WARM_FILE, WARM_DATA),
            "stat": lambda: sbx.stat(WARM_FILE),
            "list": lambda: sbx.list_dir(WARM_DIR)}


async def warm_calls(client: Client, rt: HostRuntime, cmd: str | list[str],
                     n: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per call: (API timings, runtime timings), in seconds."""
    api_sbx = client.sandboxes.create(template="base", ttl_seconds=600)
    host_sbx = await rt.create("base")
    try:
        api_calls, host_calls = api_warm_calls(api_sbx, cmd), host_warm_calls(host_sbx, cmd)
        api_calls["write"]()
        await host_calls["write"]()
        times: dict[str, tuple[list[float], list[float]]] = {}
        for name in WARM_CALLS:
            api_call, host_call = api_calls[name], host_calls[name]
            for _ in range(WARM_UPS):
                api_call()
                await host_call()
            api_t: list[float] = []
            host_t: list[float] = []
            for i in range(n):
                for side in ((0, 1) if i % 2 else (1, 0)):
                    started = time.perf_counter()
                    if side == 0:
                        api_call()
                    else:
                        await host_call()
                    (api_t if side == 0 else host_t).append(time.perf_counter() - started)
            times[name] = (api_t, host_t)
        return times
    finally:
        client.sandboxes.kill(api_sbx.id)
        await rt.kill(host_sbx.id)


def report_warm(n: int, times: dict[str, tuple[list[float], list[float]]]) -> None:
    print(f"\nwarm calls in one sandbox each side, {n} each, interleaved "
          "(API: pooled Client; runtime: the handle in-process)")
    for name, (api_t, host_t) in times.items():
        a, r = pct(api_t, 50), pct(host_t, 50)
        print(f"{name:6s} API p50 {ms(a)}  runtime p50 {ms(r)}  API adds {ms(a - r)}  "
              f"(p99 {ms(pct(api_t, 99))} vs {ms(pct(host_t, 99))})")
    print("target: the API adds <= 5 ms at p50 to each warm call")


def kill_everything(server: Server) -> None:
    """Kill whatever the API still runs (after an error mid-iteration)."""
    try:
        with Client(server.api_url, server.api_key) as client:
            for sbx in client.sandboxes.list():  # the live ones
                sbx.kill()
    except Exception as exc:  # the server may be the thing that broke
        print(f"cleanup through the API failed: {exc}", file=sys.stderr)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


SIDE_NAMES = {
    "runtime": "runtime  HostRuntime in-process       ",
    "api": "API      Sandbox.create (shared pool) ",
    "pooled": "API      Client().sandboxes.create    ",
    "agent": "agent    HostClient -> pandastack agent",
    "api_agent": "API      Client() -> serve --agent    ",
}


def report(n: int, cmd: str | list[str], sides: dict[str, Side]) -> None:
    print(f"\n{n} sequential iterations each, command {cmd!r}, interleaved")
    for key, side in sides.items():
        execs = [t - c for c, t in zip(side.created, side.total, strict=True)]
        print(f"{SIDE_NAMES[key]} create+exec p50 {ms(pct(side.total, 50))}  "
              f"p99 {ms(pct(side.total, 99))}   create p50 {ms(pct(side.created, 50))}  "
              f"exec p50 {ms(pct(execs, 50))}")
    runtime = sides["runtime"]
    labels = (("api", "API overhead, Sandbox.create"), ("pooled", "API overhead, pooled Client "),
              ("agent", "agent hop                  "))
    for key, label in labels:
        if key not in sides:
            continue
        for q in (50, 99):
            a, r = pct(sides[key].total, q), pct(runtime.total, q)
            print(f"{label} at p{q}: {ms(a - r)}  ratio {a / r:.3f}")
    if "api_agent" in sides:
        for q in (50, 99):
            a, r = pct(sides["api_agent"].total, q), pct(sides["pooled"].total, q)
            print(f"remote agent, pooled Client at p{q}: {ms(a - r)}  ratio {a / r:.3f}")
        diffs = [a - r for a, r in zip(sides["api_agent"].total, sides["pooled"].total,
                                       strict=True)]
        print(f"per-iteration difference (api_agent - pooled): p50 {ms(pct(diffs, 50))}  "
              f"min {ms(min(diffs))}  max {ms(max(diffs))}")
    for key in ("api", "agent"):
        if key in sides:
            diffs = [a - r for a, r in zip(sides[key].total, runtime.total, strict=True)]
            print(f"per-iteration difference ({key} - runtime): p50 {ms(pct(diffs, 50))}  "
                  f"min {ms(min(diffs))}  max {ms(max(diffs))}")
    if "api" in sides:
        print("target: the API adds <= 10 ms at p50")
    if "agent" in sides or "api_agent" in sides:
        print("target: the agent hop adds <= 5 ms at p50")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=30, help=f"iterations per side (<= {MAX_N})")
    parser.add_argument("--shell", action="store_true",
                        help='exec the string "true" (via /bin/sh -c) instead of ["true"]')
    parser.add_argument("--warm", type=int, default=40,
                        help="timed warm calls of each kind per side (0: none)")
    parser.add_argument("--agent", action="store_true",
                        help="also time a separate `pandastack agent` through HostClient")
    parser.add_argument("--no-api", action="store_true",
                        help="skip the REST API sides (with --agent: runtime against agent)")
    args = parser.parse_args()
    if not 1 <= args.n <= MAX_N:
        parser.error(f"--n must be between 1 and {MAX_N}")
    if not 0 <= args.warm <= MAX_N:
        parser.error(f"--warm must be between 0 and {MAX_N}")
    if args.no_api and not args.agent:
        parser.error("--no-api leaves only the runtime: add --agent")
    cmd: str | list[str] = "true" if args.shell else ["true"]
    tmp = Path(tempfile.mkdtemp(prefix="psa-", dir="/tmp"))
    runtime_state = tmp / "runtime-sandboxes"
    rt = HostRuntime(HostConfig.from_env(state_dir=runtime_state), progress=print)
    try:
        await rt.start()
        await rt.ensure_template("base")
        print(f"accelerator: {rt.driver.accel}")
        async with contextlib.AsyncExitStack() as stack:
            runs: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
                "runtime": lambda: host_once(rt, cmd)}
            if not args.no_api:
                (tmp / "server").mkdir()
                server = stack.enter_context(live_server(tmp / "server"))
                stack.callback(kill_everything, server)
                print(f"server up at {server.api_url}")
                client = stack.enter_context(Client(server.api_url, server.api_key))

                async def api() -> tuple[float, float]:
                    return api_once(server, cmd)

                async def pooled() -> tuple[float, float]:
                    return pooled_once(client, cmd)

                runs.update(api=api, pooled=pooled)
            if args.agent:
                (tmp / "agent").mkdir()
                host = stack.enter_context(live_agent(tmp / "agent"))
                await stack.enter_async_context(host)
                print(f"agent up at {host.address}")
                runs["agent"] = lambda: host_once(host, cmd)
                if not args.no_api:
                    (tmp / "server-agent").mkdir()
                    agent_dir = tmp / "agent"
                    remote = stack.enter_context(live_server(
                        tmp / "server-agent", (f"unix:{agent_dir / 'agent.sock'}",
                                               agent_dir / "agent.token")))
                    stack.callback(kill_everything, remote)
                    print(f"server over the agent up at {remote.api_url}")
                    remote_client = stack.enter_context(Client(remote.api_url, remote.api_key))

                    async def api_agent() -> tuple[float, float]:
                        return pooled_once(remote_client, cmd)

                    runs["api_agent"] = api_agent
            for run in runs.values():  # warm-up, untimed, every side
                await run()
            sides = {key: Side() for key in runs}
            order = list(runs)
            for i in range(args.n):
                for key in (reversed(order) if i % 2 else order):
                    sides[key].add(*await runs[key]())
            warm = (await warm_calls(client, rt, cmd, args.warm)
                    if args.warm and not args.no_api else None)
        report(args.n, cmd, sides)
        if warm is not None:
            report_warm(args.warm, warm)
        return 0
    finally:
        await rt.kill_all()
        await rt.close()
        for pid in qemu_pids_under(tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
