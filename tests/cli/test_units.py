"""The systemd units and their env file (deploy/systemd/): `pandastack install-units` writes
them, `systemd-analyze verify` finds nothing to say about them (PID 1 here is not systemd:
verify works offline), their hardening is what the agent's re-adoption needs, the env file
documents every setting with its true default, and the wheel ships them."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from pandastack.cli import doctor_units
from pandastack.cli.env_file import read_env_file
from pandastack.cli.main import main
from pandastack.host.config import HostConfig
from pandastack.host.images.oci.settings import RegistrySettings
from pandastack.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "systemd"
# The operator's guides, under docs/: their `pandastack` command lines must parse.
GUIDES = ("operations.md", "tls.md", "backup.md")
PANDASTACK = str(ROOT / ".venv" / "bin" / "pandastack")
# Read by the clients (the SDK, the client commands), not by a service; or by tests only.
# Read by the agent unit's ExecStart, not by the code.
UNIT_SETTINGS = {"PANDASTACK_AGENT_ARGS"}
# Read under a name the code builds (host/config.py: f"PANDASTACK_{port.upper()}").
BUILT_NAMES = {"PANDASTACK_EGRESS_HTTP_PORT", "PANDASTACK_EGRESS_TLS_PORT"}
NOT_SERVICE_SETTINGS = {"PANDASTACK_API", "PANDASTACK_API_KEY", "PANDASTACK_CA_BUNDLE",
                        "PANDASTACK_TEST_CRASH_AT", "PANDASTACK_PROBE_OK",
                        "PANDASTACK_REGISTRY_PASSWORD"}


def unit_settings(text: str) -> dict[str, list[str]]:
    """Key -> values of a unit file (continuation lines joined), across its sections."""
    out: dict[str, list[str]] = {}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def install(prefix: Path) -> list[Path]:
    assert main(["install-units", "--prefix", str(prefix), "--bin", PANDASTACK]) == 0
    return sorted((prefix / "etc/systemd/system").glob("*.service"))


def test_install_units_writes_units_and_keeps_an_existing_env_file(tmp_path: Path) -> None:
    units = install(tmp_path)
    assert [u.name for u in units] == sorted(doctor_units.UNITS)
    for unit in units:
        assert unit.stat().st_mode & 0o777 == 0o644
        starts = unit_settings(unit.read_text())["ExecStart"]
        assert len(starts) == 1 and starts[0].startswith(f"{PANDASTACK} ")
    env = tmp_path / "etc/pandastack/pandastack.env"
    assert env.stat().st_mode & 0o777 == 0o600  # it may hold the database's password
    assert env.read_text() == (DEPLOY / "pandastack.env").read_text()
    env.write_text("PANDASTACK_PORT=9000\n")
    install(tmp_path)
    assert env.read_text() == "PANDASTACK_PORT=9000\n"
    with pytest.raises(ValueError, match="absolute"):
        doctor_units.render_unit("ExecStart=/usr/local/bin/pandastack serve", "pandastack")


def verify(*units: Path) -> str:
    out = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True,
                         text=True, timeout=60, check=False)
    return f"{out.returncode}\n{out.stdout}{out.stderr}".strip()


def test_systemd_analyze_verify_has_nothing_to_say(tmp_path: Path) -> None:
    units = install(tmp_path)
    assert verify(*units) == "0"
    # It does speak up: a key it does not know and a value it cannot parse.
    bad = tmp_path / "bad.service"
    bad.write_text(units[0].read_text().replace("KillMode=process", "KillMode=sometimes")
                   + "\n[Service]\nProtectEverything=yes\n")
    said = verify(bad)
    assert "kill mode" in said.lower() and "ProtectEverything" in said


def test_the_shipped_units_verify_where_the_guide_puts_pandastack(tmp_path: Path) -> None:
    """deploy/systemd/ as it is, whose ExecStart names /usr/local/bin/pandastack: where the
    guide's `ln -s` puts the venv's executable. Plain `systemd-analyze verify
    deploy/systemd/*.service` checks that path on this host, which has no such install, so it
    runs here under `--root` as the guide's host would have it: the units installed, the
    executable pip made at that path, and this systemd's own units (the targets they order
    against). Without the executable, verify says so."""
    root = tmp_path / "root"
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    for name in doctor_units.UNITS:
        shutil.copy(DEPLOY / name, unit_dir / name)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    executable = root / doctor_units.SHIPPED_BIN.lstrip("/")
    executable.parent.mkdir(parents=True)
    shutil.copy(Path(PANDASTACK).resolve(), executable)

    def verify_in_root() -> str:
        out = subprocess.run(["systemd-analyze", "verify", f"--root={root}",
                              *doctor_units.UNITS], capture_output=True, text=True,
                             timeout=60, check=False)
        return f"{out.returncode}\n{out.stdout}{out.stderr}".strip()

    assert verify_in_root() == "0"
    executable.unlink()
    assert f"Command {doctor_units.SHIPPED_BIN} is not executable" in verify_in_root()


def test_the_agent_unit_stops_only_the_agent_and_serve_is_confined() -> None:
    agent = unit_settings((DEPLOY / "pandastack-agent.service").read_text())
    assert agent["Delegate"] == ["yes"] and agent["KillMode"] == ["process"]
    assert agent["EnvironmentFile"] == ["/etc/pandastack/pandastack.env"]
    assert agent["Restart"] == ["on-failure"]
    # A mount namespace per start would hide the previous start's network namespaces and
    # tmpfs mounts from the agent that re-adopts its VMs.
    for key in ("PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices",
                "ReadWritePaths", "PrivateMounts"):
        assert key not in agent, key
    caps = set(agent["CapabilityBoundingSet"][0].split())
    assert {"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_SETUID",
            "CAP_SYS_PTRACE"} <= caps
    assert not caps & {"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_BOOT", "CAP_SYS_TIME",
                       "CAP_NET_RAW", "CAP_SYS_RESOURCE", "CAP_BPF"}
    serve = unit_settings((DEPLOY / "pandastack-serve.service").read_text())
    assert serve["CapabilityBoundingSet"] == [""] and serve["NoNewPrivileges"] == ["yes"]
    assert serve["PrivateTmp"] == ["yes"] and serve["ProtectSystem"] == ["strict"]
    assert serve["Restart"] == ["on-failure"]
    assert serve["EnvironmentFile"] == ["/etc/pandastack/pandastack.env"]


def agent_bounding_set(drop: str = "") -> str:
    caps = unit_settings((DEPLOY / "pandastack-agent.service").read_text())
    names = [c.removeprefix("CAP_").lower() for c in caps["CapabilityBoundingSet"][0].split()]
    return ",".join(["-all", *(f"+{n}" for n in names if n != drop)])


def test_the_agent_sees_where_a_jailed_vmm_runs(tmp_path: Path) -> None:
    """The garbage collector tells a live jailed VMM from an orphan by /proc/PID/cwd
    (host/gc.py `_gone`), which another uid's process shows only to CAP_SYS_PTRACE: the
    agent's unit keeps it, and without it the link cannot be read."""
    workdir = tmp_path / "vm"
    workdir.mkdir()
    other = subprocess.Popen(["setpriv", "--reuid=200777", "--regid=200777", "--clear-groups",
                              "sleep", "60"], cwd=workdir)
    try:
        probe = f"import os; print(os.readlink('/proc/{other.pid}/cwd'))"
        for drop, expected in (("", str(workdir)), ("sys_ptrace", None)):
            out = subprocess.run(["setpriv", f"--bounding-set={agent_bounding_set(drop)}",
                                  sys.executable, "-c", probe], capture_output=True, text=True,
                                 timeout=30, check=False)
            if expected is None:
                assert out.returncode != 0 and "Permission denied" in out.stderr, out
            else:
                assert out.stdout.strip() == expected, out
    finally:
        other.kill()
        other.wait()


def settings_read_by_the_code() -> set[str]:
    """The PANDASTACK_* names of the committed sources (work in progress beside them in a
    shared tree documents its settings when it lands)."""
    tracked = subprocess.run(["git", "ls-files", "src/pandastack/*.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    names: set[str] = set()
    for path in tracked:
        if (ROOT / path).exists():
            names |= set(re.findall(r"PANDASTACK_[A-Z0-9_]*[A-Z0-9]", (ROOT / path).read_text()))
    # Prefixes of families spelled out one by one (PANDASTACK_RATE_*, PANDASTACK_QUOTA_*).
    return {n for n in names if n not in ("PANDASTACK_RATE", "PANDASTACK_QUOTA")}


def documented(text: str) -> dict[str, str]:
    """Every KEY=VALUE of the env file, commented-out defaults included."""
    return dict(re.findall(r"^#?(PANDASTACK_[A-Z0-9_]+)=(.*)$", text, re.MULTILINE))


def test_the_env_file_documents_every_setting() -> None:
    doc = documented((DEPLOY / "pandastack.env").read_text())
    missing = settings_read_by_the_code() - NOT_SERVICE_SETTINGS - set(doc)
    assert not missing, f"settings the env file does not document: {sorted(missing)}"
    unknown = set(doc) - settings_read_by_the_code() - UNIT_SETTINGS - BUILT_NAMES
    assert not unknown, f"the env file names settings nothing reads: {sorted(unknown)}"


def test_the_env_file_defaults_are_the_code_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every commented value, set, changes nothing (but where the unit puts the client
    config), and the file as shipped is valid for systemd and doctor alike."""
    text = (DEPLOY / "pandastack.env").read_text()
    shipped = read_env_file(DEPLOY / "pandastack.env")
    assert set(shipped) == {"PANDASTACK_AGENT", "PANDASTACK_AGENT_ARGS"}
    every = {k: v for k, v in documented(text).items() if k not in shipped}
    every.pop("PANDASTACK_CLIENT_CONFIG")
    for name in list(os.environ):
        if name.startswith("PANDASTACK_"):
            monkeypatch.delenv(name)
    # state_dir: None means <home>/sandboxes, which the file spells out.
    assert Settings.from_env(every).with_(state_dir=None) == Settings.from_env({})
    for key, value in every.items():
        monkeypatch.setenv(key, value)
    with_all = HostConfig.from_env()
    for key in every:
        monkeypatch.delenv(key)
    default = HostConfig.from_env()
    for resolved in ("sandboxes_dir", "snapshots_dir", "volumes_dir", "network_claims_dir"):
        assert getattr(with_all, resolved) == getattr(default, resolved), resolved
    def unspelled(config: HostConfig) -> HostConfig:
        return replace(config, state_dir=None, snapshots_root=None, volumes_root=None,
                       network_claims=None)

    assert unspelled(with_all) == unspelled(default)
    assert RegistrySettings.from_env(every) == RegistrySettings.from_env({})


def test_the_wheel_ships_the_units(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(tmp_path), str(ROOT)], check=True, timeout=300,
                   capture_output=True)
    (wheel,) = tmp_path.glob("pandastack-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (*doctor_units.UNITS, doctor_units.ENV_FILE):
        assert any(n.endswith(f".data/data/share/pandastack/systemd/{name}") for n in names)


def test_the_operations_guide_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `pandastack ...` line of the guides' shell blocks (GUIDES) is a command and
    options the CLI knows: parsed by the real parser, each command's run replaced."""
    from types import SimpleNamespace

    from pandastack.cli import main as cli_main
    from pandastack.host import file_modes

    ran: list[str] = []

    def record(args: argparse.Namespace) -> int:
        ran.append(args.command)
        return 0

    for name in cli_main.COMMAND_MODULES:
        module = cli_main.load_command(name)
        monkeypatch.setitem(cli_main.LOADED_COMMANDS, name,
                            SimpleNamespace(add_parser=module.add_parser, run=record))

    async def no_setup(args: object) -> int:
        ran.append("setup")
        return 0

    monkeypatch.setattr(cli_main, "_setup", no_setup)
    monkeypatch.setattr(file_modes, "restrict_umask", lambda: None)
    guide = "".join((ROOT / "docs" / name).read_text() for name in GUIDES)
    blocks = re.findall(r"```sh\n(.*?)```", guide, re.DOTALL)
    lines = [line.split(" #")[0].strip() for block in blocks for line in block.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("pandastack ")]
    assert len(commands) >= 8, commands
    for argv in commands:
        assert main(argv) == 0, argv
    assert ran == [argv[0] for argv in commands]
    with pytest.raises(SystemExit):  # what the check rests on: a wrong option stops it
        main(["doctor", "--bogus"])
