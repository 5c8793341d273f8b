"""`pandastack install-units`: the systemd units of `serve` and `agent` and their env file,
written where systemd reads them (deploy/systemd/ in the repository, shipped in the wheel
under <prefix>/share/pandastack/systemd/).

`--prefix` is a staging root (as DESTDIR is): files go under it, while the paths inside them
stay the target system's. ExecStart names the `pandastack` this command is (or `--bin`),
since pip puts it where its environment's scripts go, not always /usr/local/bin.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

UNITS = ("pandastack-agent.service", "pandastack-serve.service")
ENV_FILE = "pandastack.env"
SHIPPED_BIN = "/usr/local/bin/pandastack"
UNIT_DIR = Path("etc/systemd/system")
ENV_DIR = Path("etc/pandastack")
CHECKOUT_UNITS = Path(__file__).resolve().parents[3] / "deploy" / "systemd"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("install-units", help="write the systemd units of serve and agent and "
                                             "/etc/pandastack/pandastack.env (kept if present)")
    p.add_argument("--prefix", type=Path, default=Path("/"), metavar="DIR",
                   help="write under this root instead of / (staging; the units still name "
                        "/etc/pandastack/pandastack.env)")
    p.add_argument("--bin", default=None, metavar="PATH",
                   help="the pandastack executable the units run (default: this one)")


def units_dir() -> Path:
    """The shipped units: the checkout's deploy/systemd, else the installed wheel's copy."""
    if (CHECKOUT_UNITS / UNITS[0]).is_file():
        return CHECKOUT_UNITS
    import importlib.metadata

    try:
        record = importlib.metadata.files("pandastack") or []
    except importlib.metadata.PackageNotFoundError:
        record = []
    want = ("share", "pandastack", "systemd", UNITS[0])
    for f in record:
        if f.parts[-4:] == want:
            return Path(str(f.locate())).parent
    raise ValueError(f"the systemd units are missing: neither {CHECKOUT_UNITS} nor an "
                     f"installed wheel's share/pandastack/systemd")


def this_executable() -> str:
    """The `pandastack` script running now (absolute), else the one on PATH."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "pandastack" and argv0.exists():
        return str(argv0.resolve())
    found = shutil.which("pandastack")
    if found is None:
        raise ValueError("no pandastack executable found: give --bin PATH")
    return str(Path(found).resolve())


def render_unit(text: str, executable: str) -> str:
    if not os.path.isabs(executable):
        raise ValueError(f"--bin must be an absolute path, not {executable!r}")
    return text.replace(SHIPPED_BIN, executable)


def install(prefix: Path, executable: str) -> list[Path]:
    """Write the units (replacing older ones) and the env file (only if absent); the paths
    written."""
    source = units_dir()
    written: list[Path] = []
    unit_dir = prefix / UNIT_DIR
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name in UNITS:
        target = unit_dir / name
        tmp = target.with_name(f".{name}.tmp")
        tmp.write_text(render_unit((source / name).read_text(), executable))
        tmp.chmod(0o644)
        tmp.replace(target)
        written.append(target)
    env_dir = prefix / ENV_DIR
    env_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    env_file = env_dir / ENV_FILE
    try:  # never over an operator's settings
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return written
    with os.fdopen(fd, "w") as f:
        f.write((source / ENV_FILE).read_text())
    written.append(env_file)
    return written


def run(args: argparse.Namespace) -> int:
    executable = args.bin or this_executable()
    written = install(args.prefix, executable)
    for path in written:
        print(f"wrote {path}")
    if not any(p.name == ENV_FILE for p in written):
        print(f"kept {args.prefix / ENV_DIR / ENV_FILE}")
    print("next: edit /etc/pandastack/pandastack.env, `pandastack doctor --env-file "
          "/etc/pandastack/pandastack.env`, then `systemctl daemon-reload && systemctl enable "
          "--now pandastack-agent pandastack-serve`")
    return 0
