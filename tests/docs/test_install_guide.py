"""docs/operations.md, "Install", run as written (issue 38): the section's first block, read
from the guide now, with only its placeholder paths replaced (the repository's copy at
/opt/pandastack-src by a copy of this checkout's files, the venv /opt/pandastack and the link
/usr/local/bin/pandastack by paths in a temporary directory); then the installed
`pandastack --version`, `doctor --quick --role serve --json` and `install-units --prefix`
from the new venv, not this checkout's.

No network, by construction: the block runs in a network namespace of its own (`unshare
--net`: a loopback that is down), so a line that would reach out fails the test instead.
- `apt-get install -y python3-venv`: with the package installed at its candidate version apt
  has nothing to fetch (it says "already the newest version"); checked first, since on a
  host whose package lists hold a newer python3-venv it would download the upgrade: then
  the test fails and says so.
- `bash .../host-deps.sh`: runs `apt-get update` and install only for a missing package;
  after `make deps` none is, and it exits quietly.
- `pip install '...[server]'`: unchanged, with PIP_NO_INDEX=1 and PIP_FIND_LINKS naming the
  wheelhouse of scripts/wheelhouse.sh (the dependencies and the build backend, filled by
  `make wheelhouse`, which `make test` and `make pytest` run first). No wheelhouse is a
  failure that says how to make one, not a skip: a skipped test would hide that the guide's
  install is no longer checked. The machine's pip configuration is left out
  (PIP_CONFIG_FILE=/dev/null): its indexes and constraints are no part of the guide.

Root (apt-get, unshare). 20-24 s here (2026-12-05, load ~2), most of it pip. In the
parallel lane: it holds no host-wide state (dpkg's lock for a moment: no other test takes
it) and has no time bound to miss."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pandastack._version import __version__
from pandastack.cli.doctor import CHECKS
from pandastack.cli.doctor_units import ENV_FILE, UNITS
from tests.cluster.test_operations_guide import blocks, guide_section, localize
from tests.ports import free_port

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
# The guide's placeholders; the source's first, since it starts with the venv's path.
SRC = "/opt/pandastack-src"
VENV = "/opt/pandastack"
LINK = "/usr/local/bin/pandastack"


def wheelhouse() -> Path:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "wheelhouse.sh"), "path"],
                         capture_output=True, text=True, check=True, timeout=30)
    path = Path(out.stdout.strip())
    assert path.is_dir(), (
        f"no wheelhouse at {path}: run `make wheelhouse` (network; `make test` and `make "
        f"pytest` run it first). The test installs the guide's pip line from it, offline.")
    return path


def repository_copy(dst: Path) -> Path:
    """This checkout's files as a copy of the repository has them: tracked and new ones,
    not what git ignores (.venv, caches, build output)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True, timeout=60)
    names = [n for n in out.stdout.decode().split("\0") if n]
    assert "pyproject.toml" in names, "the repository's files are listed by git"
    for name in names:
        src = ROOT / name
        if not src.exists() and not src.is_symlink():  # deleted, not yet committed
            continue
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / name, follow_symlinks=False)
    return dst


def assert_nothing_to_fetch(block: str) -> None:
    """Each package the block's apt-get installs is installed at the version apt would
    install, so `apt-get install` downloads nothing."""
    packages = [p for m in re.findall(r"apt-get install -y ([^\n#]+)", block)
                for p in m.split()]
    assert packages, f"the block installs nothing with apt-get:\n{block}"
    for package in packages:
        policy = subprocess.run(["apt-cache", "policy", package], capture_output=True,
                                text=True, check=True, timeout=60).stdout
        fields = dict(re.findall(r"^\s+(Installed|Candidate): (\S+)$", policy, re.M))
        assert fields.get("Installed") not in (None, "(none)"), (
            f"{package} is not installed: `make deps` installs it (the test runs offline)")
        assert fields["Installed"] == fields.get("Candidate"), (
            f"{package} {fields['Installed']} is installed but apt would install "
            f"{fields.get('Candidate')}: the guide's apt-get line would download it. "
            f"Upgrade the host's packages, then run the test again.")


def offline_env(wheels: Path) -> dict[str, str]:
    """Root's shell with pip pointed at the wheelhouse and nothing else: no venv of this
    checkout on PATH (`python3` is the machine's), no pandastack or pip settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PANDASTACK_")) and k not in ("VIRTUAL_ENV",
                                                                      "PYTHONPATH")}
    ours = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p.rstrip("/") != ours)
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels), PIP_CONFIG_FILE=os.devnull,
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def test_install_as_the_guide_writes_it(tmp_path: Path) -> None:
    wheels = wheelhouse()
    block = blocks(guide_section("Install"))[0]
    assert_nothing_to_fetch(block)
    src = repository_copy(tmp_path / "src")
    venv = tmp_path / "venv"
    (tmp_path / "bin").mkdir()
    link = tmp_path / "bin" / "pandastack"
    script = localize(block, {SRC: str(src), VENV: str(venv), LINK: str(link)})
    assert not re.search(r"/opt/|/usr/local/", script), script
    try:
        run = subprocess.run(["unshare", "--net", "--", "bash", "-euxo", "pipefail", "-c",
                              script], cwd=tmp_path, env=offline_env(wheels),
                             capture_output=True, text=True, timeout=540)
        said = run.stdout + run.stderr
        assert run.returncode == 0, said[-6000:]
        assert "already the newest version" in said, said[-6000:]
        assert "host-deps: installing" not in said
        _check_the_install(tmp_path, src, venv, link)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _check_the_install(tmp: Path, src: Path, venv: Path, link: Path) -> None:
    assert link.is_symlink() and link.resolve() == (venv / "bin" / "pandastack").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PANDASTACK_")}

    def pandastack(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(link), *argv], env={**env, **extra}, cwd=tmp,
                              capture_output=True, text=True, timeout=120)

    out = pandastack("--version")
    assert (out.returncode, out.stdout.strip()) == (0, f"pandastack {__version__}"), out.stderr

    # The venv's own copy of the package (a regular install, not a link to the sources).
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import pandastack; print(pandastack.__file__)"], cwd=tmp,
                           env=env, capture_output=True, text=True, check=True, timeout=60)
    installed = Path(where.stdout.strip())
    assert installed.is_relative_to(venv) and "site-packages" in installed.parts, installed

    home = tmp / "home"
    port = free_port()
    out = pandastack("doctor", "--quick", "--role", "serve", "--json",
                     PANDASTACK_HOME=str(home), PANDASTACK_PORT=str(port),
                     PANDASTACK_PREVIEW_PORT="0")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    checks = {c["check"]: c for c in doc["checks"]}
    # The serve role's checks, each answered: none failed, none broke (the server extra's
    # packages import), and a fresh home is what the guide's next steps fill.
    assert list(checks) == [s.name for s in CHECKS if "serve" in s.roles], checks
    assert doc["can_serve"] is True and doc["counts"]["fail"] == 0, doc
    assert "bug" not in out.stdout
    assert checks["settings"]["status"] == "ok" and str(home) in checks["settings"]["summary"]
    assert checks["ports"]["status"] == "ok" and str(port) in checks["ports"]["summary"]
    assert checks["database"]["status"] == "ok", checks["database"]
    assert f"sqlite:///{home}/pandastack.db" in checks["database"]["summary"]
    assert checks["encryption key"]["status"] == "warn"
    assert "pandastack setup" in checks["encryption key"]["fix"]
    assert not home.exists()  # doctor looks, it makes nothing

    # The units come out of the installed wheel's data files (no checkout beside this venv)
    # and run the venv's pandastack.
    staging = tmp / "staging"
    out = pandastack("install-units", "--prefix", str(staging))
    assert out.returncode == 0, out.stdout + out.stderr
    exe = str((venv / "bin" / "pandastack").resolve())
    for name in UNITS:
        shipped = (src / "deploy" / "systemd" / name).read_text()
        written = (staging / "etc" / "systemd" / "system" / name).read_text()
        assert written == shipped.replace(LINK, exe) and exe in written
    assert (staging / "etc" / "pandastack" / ENV_FILE).read_text() == \
        (src / "deploy" / "systemd" / ENV_FILE).read_text()
