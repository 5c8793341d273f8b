#!/usr/bin/env python3
"""`make cluster HOSTS=N` / `make cluster-down`: a cluster on this machine for development and
tests (issue 17, ADR 0021). Up starts a private PostgreSQL (scripts/pg-cluster), a private S3
server (scripts/s3-server), N `pandastack agent`s and one API server on 127.0.0.1:PORT that
drives them and writes the admin key to the usual client config file. It prints, and writes
to `.cluster/hosts.json` in the checkout (git-ignored), each agent's host id, pid, network
namespace, endpoint and home, so that a test can stop one. Down removes all of it.
`stop-agent N` / `start-agent N` and `restart-serve` stand in for `systemctl stop|start
pandastack-agent` and `systemctl restart pandastack-serve` on a host (a rolling upgrade,
docs/operations.md, "Upgrades"): SIGTERM to that process alone (its VMs run on), and the same
command line started again.

Each agent runs as if on a machine of its own:
- a network namespace `pcl-N`, linked to this one by a veth pair (`pclvN` here, `uplink0`
  there) with a /30 of a private range (default 10.213.0.0/16), a default route back and
  masquerading here, so its sandboxes' namespaces, veths, slot addresses and nftables tables
  are its own; it listens on TCP on its veth address, with one token file for all;
- a mount namespace of its own, kept in `/run/pandastack-cluster/mnt-N` (so an agent started
  again joins the same one and finds its sandboxes' namespaces), with its own tmpfs on
  /run/netns (its `ip netns` names collide with nobody's), on the fork buffers' and the
  network registry's /run directories, and its own sysfs (its links, not this namespace's);
- its own PANDASTACK_HOME and network claims. Guest images and templates are shared (the
  home's `cache` and `templates` link to this machine's PANDASTACK_HOME): building them once
  per agent would take the better part of an hour.

PostgreSQL and the S3 server listen on 127.0.0.1 here; an agent reaches them through a relay
on its veth's address here (`relay`, in this file). `--db`/`--object-store`/`--advertise` are
given to agents whose `pandastack agent` has them; the API server drives the agents of the
host registry (`serve --db DSN --no-local-agent`, the default), or by `--agent URL` each
with `--no-registry` (PANDASTACK_CLUSTER_REGISTRY=0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / ".cluster"
STATE = Path(os.environ.get("PANDASTACK_CLUSTER_DIR", "/var/lib/pandastack-cluster"))
RUN = Path("/run/pandastack-cluster")
SHARED_HOME = Path(os.environ.get("PANDASTACK_HOME", "/var/lib/pandastack"))
NS_PREFIX = "pcl-"
VETH_PREFIX = "pclv"
UPLINK = "uplink0"
NFT_TABLE = "pandastack_cluster"
AGENT_PORT = 7000
STAGE_ROOT = Path("/dev/shm/pandastack-memory")
# Mounted privately in each agent's mount namespace (tmpfs): what it names there is its own.
PRIVATE_RUN_DIRS = ("/run/netns", "/run/pandastack-fork-buffers", "/run/pandastack-network")
START_TIMEOUT = 300.0
STOP_TIMEOUT = 30.0


def sh(*argv: str, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False,
                          **kwargs)  # type: ignore[call-overload]
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done  # type: ignore[no-any-return]


def has_option(command: list[str], option: str) -> bool:
    done = sh(sys.executable, "-m", "pandastack", *command, "--help", check=False, cwd=ROOT)
    return option in done.stdout


def wait_for(check: object, what: str, log: Path, proc: subprocess.Popen[bytes] | None,
             timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise SystemExit(f"{what} did not come up:\n{tail}")
        time.sleep(0.2)


def tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def addresses(subnet: str, n: int) -> tuple[str, str]:
    """(here, agent's) addresses of agent `n`'s /30."""
    base = ipaddress.ip_network(subnet).network_address + 4 * n
    return str(base + 1), str(base + 2)


def via(url: str, host: str) -> str:
    """`url` with its 127.0.0.1 replaced by `host` (where the relay listens), in the URLs its
    query carries too: the object store's URL names the S3 server in `?endpoint=`, and that
    one wins over PANDASTACK_S3_ENDPOINT (issue 33: agents got the loopback of this namespace,
    which is not theirs, and every snapshot answered 503)."""
    parts = urlsplit(url)
    netloc = parts.netloc.replace("127.0.0.1", host)
    query = [(name, via(value, host) if "://" in value else value)
             for name, value in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe=":/")))


def save(record: dict[str, object]) -> None:
    CLUSTER.mkdir(exist_ok=True)
    tmp = CLUSTER / "hosts.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, CLUSTER / "hosts.json")


# -- up ---------------------------------------------------------------------------------------

def up(hosts: int, port: int, subnet: str, registry: bool) -> int:
    if (CLUSTER / "hosts.json").exists() or any(n.startswith(NS_PREFIX) for n in netns()):
        raise SystemExit("a cluster is up already (make cluster-down first)")
    STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE, 0o711)  # PostgreSQL's and Swift's users must reach their directories
    record: dict[str, object] = {"state": str(STATE), "hosts": []}
    save(record)  # from here on, down can undo a partial up
    try:
        return _up(record, hosts, port, subnet, registry)
    except BaseException:
        print("cluster: up failed, taking down what it started", file=sys.stderr)
        down()
        raise


def _up(record: dict[str, object], hosts: int, port: int, subnet: str, registry: bool) -> int:
    python = sys.executable
    dsn = sh(str(ROOT / "scripts" / "pg-cluster"), "start", str(STATE / "postgres")).stdout
    dsn = dsn.strip()
    record["postgres"] = {"dir": str(STATE / "postgres"), "dsn": dsn}
    save(record)
    s3_out = sh("/usr/bin/python3", str(ROOT / "scripts" / "s3-server"), "start",
                str(STATE / "s3")).stdout
    s3_env = dict(line.removeprefix("export ").split("=", 1) for line in s3_out.splitlines()
                  if line.startswith("export "))
    s3_env = {k: v.strip("'\"") for k, v in s3_env.items()}
    record["s3"] = {"dir": str(STATE / "s3"), "endpoint": s3_env.get("PANDASTACK_S3_ENDPOINT")}
    save(record)

    token = STATE / "agent.token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    _private_run_dir()
    for directory in PRIVATE_RUN_DIRS:
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)  # mount points
    _masquerade(subnet)

    db_port = urlsplit(dsn.replace("postgresql+psycopg", "postgresql")).port
    s3_port = urlsplit(s3_env["PANDASTACK_S3_ENDPOINT"]).port
    pairs = []
    for n in range(1, hosts + 1):
        here, _ = addresses(subnet, n)
        _namespace(n, subnet)
        pairs += [f"{here}:{db_port}=127.0.0.1:{db_port}", f"{here}:{s3_port}=127.0.0.1:{s3_port}"]
    relay_log = CLUSTER / "relay.log"
    with relay_log.open("ab") as out:
        relay = subprocess.Popen([python, str(Path(__file__).resolve()), "relay", *pairs],
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    record["relay_pid"] = relay.pid
    save(record)

    agent_db = has_option(["agent"], "--db")
    agent_objects = has_option(["agent"], "--object-store")
    agent_advertise = has_option(["agent"], "--advertise")
    agents: list[dict[str, object]] = []
    procs = []
    for n in range(1, hosts + 1):
        here, there = addresses(subnet, n)
        home = STATE / f"host-{n}" / "home"
        home.mkdir(parents=True, mode=0o700)
        for name in ("cache", "templates"):
            (home / name).symlink_to(SHARED_HOME / name)
        endpoint = f"http://{there}:{AGENT_PORT}"
        argv = [python, "-m", "pandastack", "agent", "--listen", f"{there}:{AGENT_PORT}",
                "--token-file", str(token)]
        if agent_db:
            argv += ["--db", via(dsn, here)]
        if agent_advertise:
            argv += ["--advertise", endpoint]
        env = agent_env(home)
        env.update({k: via(v, here) if "127.0.0.1" in v else v for k, v in s3_env.items()})
        if agent_objects:
            argv += ["--object-store", env["PANDASTACK_OBJECT_STORE"]]
        log = CLUSTER / f"agent-{n}.log"
        proc = launch(f"agent-{n}", in_agent(n, argv), env, log)
        procs.append(proc)
        agents.append({"host_id": None, "pid": proc.pid, "namespace": f"{NS_PREFIX}{n}",
                       "endpoint": endpoint, "home": str(home),
                       "state_dir": str(home / "sandboxes"), "log": str(log),
                       "mount_ns": str(RUN / f"mnt-{n}")})
        record["hosts"] = agents
        save(record)
    for agent, proc in zip(agents, procs, strict=True):
        host = urlsplit(str(agent["endpoint"]))
        wait_for(lambda h=host: tcp_open(str(h.hostname), int(h.port or 0)),
                 f"agent {agent['endpoint']}", Path(str(agent["log"])), proc)

    log = CLUSTER / "server.log"
    env = {**os.environ, "PANDASTACK_PORT": str(port), "PANDASTACK_DB": dsn,
           "PANDASTACK_AGENT_TOKEN_FILE": str(token)}
    argv = [python, "-m", "pandastack", "serve", "--port", str(port)]
    use_registry = registry and agent_db and has_option(["serve"], "--no-local-agent")
    if use_registry:
        argv += ["--db", dsn, "--no-local-agent"]
    else:
        env["PANDASTACK_AGENT"] = ",".join(str(a["endpoint"]) for a in agents)
    config = client_config()
    if config.exists():  # the server of a fresh database writes a new admin key there
        shutil.copy2(config, CLUSTER / "client-config.before")
    server = launch("serve", argv, env, log)
    record.update({"api": f"http://127.0.0.1:{port}", "server_pid": server.pid,
                   "server_log": str(log), "registry": use_registry})
    save(record)
    wait_for(lambda: healthy(port), "the API server", log, server)
    if agent_db:
        _host_ids(dsn, agents)
    record["hosts"] = agents
    save(record)
    print(json.dumps(record, indent=2))
    return 0


def launch(name: str, argv: list[str], env: dict[str, str], log: Path
           ) -> subprocess.Popen[bytes]:
    """Start `argv` as cluster process `name`, and keep how (mode 0600: the environment holds
    the object store's keys) for `relaunch`."""
    fd = os.open(CLUSTER / f"{name}.launch.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"argv": argv, "env": env, "log": str(log)}, f)
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def relaunch(name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Cluster process `name` started again as `launch` started it; it and its log."""
    kept = json.loads((CLUSTER / f"{name}.launch.json").read_text())
    log = Path(kept["log"])
    return launch(name, kept["argv"], kept["env"], log), log


def _record() -> dict[str, object]:
    path = CLUSTER / "hosts.json"
    if not path.exists():
        raise SystemExit("no cluster is up (make cluster)")
    record: dict[str, object] = json.loads(path.read_text())
    return record


def _agent(record: dict[str, object], n: int) -> dict[str, object]:
    hosts = record["hosts"]
    assert isinstance(hosts, list)
    if not 1 <= n <= len(hosts):
        raise SystemExit(f"no agent {n}: the cluster has {len(hosts)}")
    agent: dict[str, object] = hosts[n - 1]
    return agent


def stop_agent(n: int) -> int:
    """What `systemctl stop pandastack-agent` does (KillMode=process): SIGTERM to the agent
    alone, which ends without its VMs; the next start re-adopts them."""
    _stop(int(str(_agent(_record(), n)["pid"])), "agent")
    print(f"agent {n} stopped")
    return 0


def start_agent(n: int) -> int:
    record = _record()
    agent = _agent(record, n)
    if _is(int(str(agent["pid"])), "agent"):
        raise SystemExit(f"agent {n} runs already (pid {agent['pid']})")
    proc, log = relaunch(f"agent-{n}")
    agent["pid"] = proc.pid
    save(record)
    host = urlsplit(str(agent["endpoint"]))
    wait_for(lambda: tcp_open(str(host.hostname), int(host.port or 0)),
             f"agent {agent['endpoint']}", log, proc)
    print(f"agent {n} started (pid {proc.pid})")
    return 0


def restart_serve() -> int:
    """What `systemctl restart pandastack-serve` does: SIGTERM, then the same start."""
    record = _record()
    _stop(int(str(record["server_pid"])), "serve")
    proc, log = relaunch("serve")
    record["server_pid"] = proc.pid
    save(record)
    port = urlsplit(str(record["api"])).port or 0
    wait_for(lambda: healthy(port), "the API server", log, proc)
    print(f"API server restarted (pid {proc.pid})")
    return 0


def client_config() -> Path:
    """Where `pandastack serve` writes the first admin key (server/settings.py)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "pandastack" / "config.json"


def agent_env(home: Path) -> dict[str, str]:
    return {**os.environ, "PANDASTACK_HOME": str(home),
            "PANDASTACK_NETWORK_CLAIMS": str(home / "network" / "claims")}


def in_agent(n: int, argv: list[str]) -> list[str]:
    """`argv` run in agent `n`'s mount and network namespaces."""
    return ["nsenter", f"--mount={RUN / f'mnt-{n}'}", f"--net=/run/netns/{NS_PREFIX}{n}",
            "--", *argv]


def healthy(port: int) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _host_ids(dsn: str, agents: list[dict[str, object]], timeout: float = 60.0) -> None:
    """Each agent's id in the registry, by the endpoint it registered (None until it has)."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn.replace("postgresql+psycopg://", "postgresql://")) as conn:
        while True:
            for agent in agents:
                try:
                    row = conn.execute("SELECT id FROM hosts WHERE endpoint = %s",
                                       (agent["endpoint"],)).fetchone()
                except psycopg.errors.UndefinedTable:
                    conn.rollback()
                    row = None
                agent["host_id"] = row[0] if row else None
            if all(a["host_id"] for a in agents) or time.monotonic() > deadline:
                return
            time.sleep(0.5)


def _private_run_dir() -> None:
    """A private mount for the agents' mount namespace files (a persistent namespace cannot
    be kept on a shared mount)."""
    RUN.mkdir(mode=0o700, exist_ok=True)
    if not mounted(RUN):
        sh("mount", "--bind", str(RUN), str(RUN))
    sh("mount", "--make-private", str(RUN))


def _namespace(n: int, subnet: str) -> None:
    ns, veth = f"{NS_PREFIX}{n}", f"{VETH_PREFIX}{n}"
    here, there = addresses(subnet, n)
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", UPLINK, "netns", ns)
    sh("ip", "addr", "add", f"{here}/30", "dev", veth)
    sh("ip", "link", "set", veth, "up")
    for command in (f"addr add {there}/30 dev {UPLINK}", f"link set {UPLINK} up",
                    "link set lo up", f"route add default via {here}"):
        sh("ip", "-n", ns, *command.split())
    mnt = RUN / f"mnt-{n}"
    mnt.touch()
    mounts = " && ".join(f"mount -t tmpfs -o mode=0700 pandastack-cluster {d}"
                         for d in PRIVATE_RUN_DIRS)
    sh("unshare", f"--mount={mnt}", "--propagation", "private", "nsenter", f"--net=/run/netns/{ns}",
       "--", "sh", "-c", f"{mounts} && mount -t sysfs pandastack-cluster /sys")


def _masquerade(subnet: str) -> None:
    """The agents' traffic (their sandboxes' included) leaves through this namespace."""
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    ruleset = f"""
table inet {NFT_TABLE} {{
    chain postrouting {{
        type nat hook postrouting priority 100; policy accept;
        ip saddr {subnet} oifname != "{VETH_PREFIX}*" masquerade
    }}
}}
"""
    sh("nft", "-f", "-", input=ruleset)


# -- down -------------------------------------------------------------------------------------

def netns() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def mounted(path: Path) -> bool:
    """Whether something is mounted on `path` (os.path.ismount misses a bind mount of a
    directory on its own file system)."""
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return str(path) in points


def _is(pid: int, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _stop(pid: int, marker: str, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, then SIGKILL, to `pid` if it is still the process we started (its command
    line holds `marker`): a pid left by a dead one may be another process's now."""
    if not _is(pid, marker):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is(pid, marker):
        time.sleep(0.1)
    if _is(pid, marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ns_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _kill_in(mnt: Path, ns: str) -> None:
    """SIGKILL every process left in agent's mount or network namespace."""
    targets = {("mnt", _ns_inode(str(mnt))), ("net", _ns_inode(f"/run/netns/{ns}"))}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for kind, inode in targets:
            if inode is not None and _ns_inode(f"{entry}/ns/{kind}") == inode:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
                break


KILL_ALL = """
import asyncio
from pandastack.host.config import HostConfig
from pandastack.host.runtime import HostRuntime
async def main():
    rt = HostRuntime(HostConfig.from_env(), progress=lambda m: None)
    await rt.start(); await rt.kill_all(); await rt.close()
asyncio.run(main())
"""


def down() -> int:
    path = CLUSTER / "hosts.json"
    record = json.loads(path.read_text()) if path.exists() else {"hosts": []}
    if "server_pid" in record:
        _stop(int(record["server_pid"]), "serve")
    for agent in record["hosts"]:
        _stop(int(agent["pid"]), "agent")
    numbers = sorted({int(name[len(NS_PREFIX):]) for name in netns()
                      if name.startswith(NS_PREFIX) and name[len(NS_PREFIX):].isdigit()})
    for n in numbers:
        mnt, ns, home = RUN / f"mnt-{n}", f"{NS_PREFIX}{n}", STATE / f"host-{n}" / "home"
        if mounted(mnt) and home.is_dir():
            # What the agent still ran: a runtime in its namespaces re-adopts it and kills it.
            subprocess.run(in_agent(n, [sys.executable, "-c", KILL_ALL]), cwd=ROOT,
                           env=agent_env(home), check=False)
        _kill_in(mnt, ns)
        if mounted(mnt):
            sh("umount", str(mnt), check=False)
        mnt.unlink(missing_ok=True)
        sh("ip", "netns", "del", ns, check=False)
        if Path(f"/sys/class/net/{VETH_PREFIX}{n}").exists():
            sh("ip", "link", "del", f"{VETH_PREFIX}{n}", check=False)
    if "relay_pid" in record:
        _stop(int(record["relay_pid"]), "relay")
    sh("nft", "delete", "table", "inet", NFT_TABLE, check=False)
    if (STATE / "s3").exists():
        sh("/usr/bin/python3", str(ROOT / "scripts" / "s3-server"), "stop", str(STATE / "s3"),
           check=False)
    if (STATE / "postgres").exists():
        sh(str(ROOT / "scripts" / "pg-cluster"), "stop", str(STATE / "postgres"), check=False)
    if mounted(RUN):
        sh("umount", str(RUN), check=False)
    with contextlib.suppress(OSError):
        RUN.rmdir()
    # The cluster's admin key is useless now: give back the key that was there before.
    before = CLUSTER / "client-config.before"
    if before.exists():
        os.replace(before, client_config())
    elif "server_pid" in record:
        client_config().unlink(missing_ok=True)
    shutil.rmtree(STAGE_ROOT / STATE.relative_to("/"), ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)
    shutil.rmtree(CLUSTER, ignore_errors=True)
    print("cluster down")
    return 0


# -- relay ------------------------------------------------------------------------------------

async def relay(pairs: list[str]) -> None:
    """Forward each LISTEN_HOST:PORT=TARGET_HOST:PORT (here: an agent's way to a service that
    listens on this namespace's loopback)."""
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def handler(host: str, port: int):  # type: ignore[no-untyped-def]
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        return handle

    servers = []
    for pair in pairs:
        listen, target = pair.split("=")
        lhost, lport = listen.rsplit(":", 1)
        thost, tport = target.rsplit(":", 1)
        servers.append(await asyncio.start_server(handler(thost, int(tport)), lhost, int(lport)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--subnet", default=os.environ.get("PANDASTACK_CLUSTER_SUBNET",
                                                       "10.213.0.0/16"))
    p.add_argument("--registry", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("PANDASTACK_CLUSTER_REGISTRY", "1") != "0",
                   help="the API server drives the agents of the host registry "
                        "(serve --db DSN --no-local-agent; the default), or with "
                        "--no-registry the agents by their URLs (--agent URL each)")
    sub.add_parser("down")
    for name in ("stop-agent", "start-agent"):
        sub.add_parser(name).add_argument("agent", type=int, metavar="N")
    sub.add_parser("restart-serve")
    r = sub.add_parser("relay")
    r.add_argument("pairs", nargs="+")
    args = parser.parse_args()
    if args.command == "up":
        if not 1 <= args.hosts <= 16:
            parser.error("--hosts must be between 1 and 16")
        return up(args.hosts, args.port, args.subnet, args.registry)
    if args.command == "relay":
        asyncio.run(relay(args.pairs))
        return 0
    if args.command == "stop-agent":
        return stop_agent(args.agent)
    if args.command == "start-agent":
        return start_agent(args.agent)
    if args.command == "restart-serve":
        return restart_serve()
    return down()


if __name__ == "__main__":
    sys.exit(main())
