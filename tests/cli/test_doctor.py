"""`pandastack doctor`: the verdicts' pure parts, checks against real ports, files and a
database, and the command run for real on this machine with broken settings."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from pandastack.cli import doctor_host as hostchk
from pandastack.cli import doctor_secrets as keychk
from pandastack.cli import doctor_services as svc
from pandastack.cli.doctor import CHECKS
from pandastack.cli.doctor_model import (
    CheckSpec,
    Context,
    Finding,
    as_json,
    exit_status,
    run_checks,
)
from pandastack.cli.env_file import read_env_file
from pandastack.server.registries.sealing import load_key, make_key_file
from pandastack.server.registries.service import RegistryCredentialService
from pandastack.server.settings import Settings
from pandastack.server.store import open_store
from pandastack.wire.registries import RegistryLogin
from tests.ports import free_port
from tests.services import Postgres

ROOT = Path(__file__).resolve().parents[2]
PANDASTACK = ROOT / ".venv" / "bin" / "pandastack"


def test_a_warn_or_fail_must_say_how_to_fix_it() -> None:
    Finding("x", "ok", "fine")
    with pytest.raises(ValueError, match="how to fix"):
        Finding("x", "fail", "broken")
    with pytest.raises(ValueError, match="how to fix"):
        Finding("x", "warn", "meh")


def test_verdict_and_json_shape() -> None:
    findings = [Finding("a", "ok", "fine"), Finding("b", "warn", "slow", "do x")]
    assert exit_status(findings) == 0
    assert exit_status([*findings, Finding("c", "fail", "no", "do y")]) == 1
    doc = as_json([*findings, Finding("c", "fail", "no", "do y")])
    assert doc["can_serve"] is False and doc["counts"] == {"ok": 1, "warn": 1, "fail": 1}
    checks = doc["checks"]
    assert isinstance(checks, list)
    assert checks[2] == {"check": "c", "status": "fail", "summary": "no", "fix": "do y"}


def test_a_check_that_raises_is_a_fail_and_roles_select_checks() -> None:
    def boom(_ctx: Context) -> Finding:
        raise RuntimeError("kaput")

    specs = (CheckSpec("boom", boom, ("agent",)),
             CheckSpec("fine", lambda _c: Finding("fine", "ok", "yes"), ("serve",)))
    ctx = Context(settings=None, host=None)
    both = run_checks(specs, ctx)
    assert [(f.check, f.status) for f in both] == [("boom", "fail"), ("fine", "ok")]
    assert "kaput" in both[0].summary and both[0].fix
    assert [f.check for f in run_checks(specs, ctx, ("serve",))] == ["fine"]


def test_parsers() -> None:
    assert hostchk.parse_qemu_release("QEMU emulator version 7.2.22 (Debian)") == (7, 2)
    assert hostchk.parse_qemu_release("something else") is None
    assert hostchk.parse_thp("always [madvise] never") == "madvise"
    assert hostchk.parse_thp("[never]") == "never"
    assert hostchk.disk_verdict(1 << 30) == "fail"
    assert hostchk.disk_verdict(10 << 30) == "warn"
    assert hostchk.disk_verdict(100 << 30) == "ok"


def test_cgroup_verdicts() -> None:
    v2 = hostchk.cgroup_verdict
    assert v2("cpuset cpu io memory hugetlb pids", {}, True)[0] == "ok"
    status, summary = v2("cpu memory", {}, True)
    assert status == "warn" and "io" in summary and "pids" in summary
    assert v2("cpu io memory pids", {}, False) == ("warn", "cgroup v2, not writable by this user")
    status, summary = v2(None, {"cpu": True, "memory": True, "pids": True}, False)
    assert status == "warn" and summary.startswith("cgroup v1 (works")
    status, summary = v2(None, {"cpu": True, "memory": False, "pids": True}, False)
    assert status == "warn" and "memory" in summary


def test_env_file_reading(tmp_path: Path) -> None:
    path = tmp_path / "env"
    path.write_text("# comment\n\n; another\nA=1\nB = \"two words\"\nC='x'\nD=\n")
    assert read_env_file(path) == {"A": "1", "B": "two words", "C": "x", "D": ""}
    path.write_text("export A=1\n")
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        read_env_file(path)


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_ports(held_port: int) -> None:
    assert svc.port_free("127.0.0.1", held_port) == "in use"
    port = free_port()
    assert svc.port_free("127.0.0.1", port) is None
    ctx = Context(settings=Settings(port=held_port, preview_port=0), host=None)
    finding = svc.check_ports(ctx)
    assert finding.status == "fail" and str(held_port) in finding.summary and finding.fix
    # A sandbox listener left to its default (API + 1) that is taken: serve runs without it.
    ctx = Context(settings=Settings(port=held_port - 1), host=None)
    if svc.port_free("127.0.0.1", held_port - 1) is None:
        assert svc.check_ports(ctx).status == "warn"
    ctx = Context(settings=Settings(port=port, preview_port=held_port), host=None)
    assert svc.check_ports(ctx).status == "fail"  # set explicitly: serve refuses to start
    assert svc.check_ports(Context(settings=Settings(port=port, preview_port=0),
                                   host=None)).status == "ok"


def test_database_checks_touch_nothing(tmp_path: Path) -> None:
    absent = tmp_path / "new" / "p.db"
    finding = svc.check_database(Context(Settings(db_url=f"sqlite:///{absent}"), None))
    assert finding.status == "ok" and "first start" in finding.summary
    assert not absent.exists() and not absent.parent.exists()
    present = tmp_path / "p.db"
    sqlite3.connect(present).close()
    finding = svc.check_database(Context(Settings(db_url=f"sqlite:///{present}"), None))
    assert finding.status == "ok", finding
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.db"]  # no -wal, no -journal
    refused = f"postgresql://doctor:secret@127.0.0.1:{free_port()}/nowhere"
    finding = svc.check_database(Context(Settings(db_url=refused), None))
    assert finding.status == "fail" and "PANDASTACK_DB" in finding.fix
    assert "secret" not in finding.summary  # the password is never shown
    finding = svc.check_database(Context(Settings(db_url="nonsense://"), None))
    assert finding.status == "fail"


def test_object_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PANDASTACK_OBJECT_STORE", raising=False)
    assert svc.check_object_store(Context(None, None)).status == "ok"
    monkeypatch.setenv("PANDASTACK_OBJECT_STORE",
                       f"s3://bucket?endpoint=http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("PANDASTACK_S3_ACCESS_KEY", "a")
    monkeypatch.setenv("PANDASTACK_S3_SECRET_KEY", "b")
    finding = svc.check_object_store(Context(None, None))
    assert finding.status == "fail" and "did not answer" in finding.summary, finding
    monkeypatch.setenv("PANDASTACK_OBJECT_STORE", "http://not-s3")
    assert svc.check_object_store(Context(None, None)).status == "fail"


def test_database_and_object_store_that_answer(postgres: Postgres, s3_env: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's real PostgreSQL and S3 servers: ok with their credentials, a fail
    naming the fix with a wrong password or key."""
    with postgres.database() as dsn:
        finding = svc.check_database(Context(Settings(db_url=dsn), None))
        assert finding.status == "ok" and "answers" in finding.summary, finding
        key = Path(tempfile.mkdtemp()) / "encryption.key"
        make_key_file(key)
        store = open_store(dsn)
        try:
            asyncio.run(RegistryCredentialService(store, key).login(
                "team-a", "ghcr.io", RegistryLogin(username="bot", password=SecretStr("pw"))))
        finally:
            store.close()
        finding = keychk.check_encryption_key(Context(Settings(
            db_url=dsn, encryption_key_file=key), None))
        assert finding.status == "ok" and "sealed the 1 stored" in finding.summary, finding
        key.unlink()
        key.parent.rmdir()
        wrong = make_url(dsn).set(password="wrong").render_as_string(hide_password=False)
        finding = svc.check_database(Context(Settings(db_url=wrong), None))
        assert finding.status == "fail" and "password" in finding.summary, finding
        assert "wrong" not in finding.summary
    for name, value in s3_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PANDASTACK_OBJECT_STORE", f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/doc")
    finding = svc.check_object_store(Context(None, None))
    assert finding.status == "ok" and "answers" in finding.summary, finding
    monkeypatch.setenv("PANDASTACK_S3_SECRET_KEY", "not-the-secret")
    finding = svc.check_object_store(Context(None, None))
    assert finding.status == "fail" and "PANDASTACK_S3_SECRET_KEY" in finding.fix, finding
    monkeypatch.setenv("PANDASTACK_S3_SECRET_KEY", s3_env["PANDASTACK_S3_SECRET_KEY"])
    monkeypatch.setenv("PANDASTACK_OBJECT_STORE", "s3://no-such-bucket-here/doc")
    finding = svc.check_object_store(Context(None, None))
    assert finding.status == "fail", finding


def test_encryption_key_file_and_the_credentials_it_sealed(tmp_path: Path) -> None:
    """The key `pandastack setup` makes, checked as the server loads it and against the
    credentials a real store holds (sealed through the service, as a login does)."""
    key, db = tmp_path / "encryption.key", tmp_path / "pandastack.db"
    ctx = Context(Settings(home=tmp_path, db_url=f"sqlite:///{db}"), None)

    def check() -> Finding:
        return keychk.check_encryption_key(ctx)

    finding = check()  # no key, no database yet
    assert finding.status == "warn" and "no key at" in finding.summary, finding
    assert "pandastack setup" in finding.fix and not db.exists()
    assert make_key_file(key)
    assert check().status == "ok" and "no stored registry credentials" in check().summary
    store = open_store(f"sqlite:///{db}")
    try:
        service = RegistryCredentialService(store, key)
        for registry in ("ghcr.io", "registry.example.com:5000"):
            asyncio.run(service.login("team-a", registry, RegistryLogin(
                username="bot", password=SecretStr("hunter2-secret"))))
    finally:
        store.close()
    finding = check()
    assert finding.status == "ok" and "sealed the 2 stored" in finding.summary, finding
    assert "hunter2" not in json.dumps(as_json([finding]))
    with sqlite3.connect(db) as conn:  # sealed by this key, but for another row: no opening
        saved = conn.execute("SELECT registry, secret FROM registry_credentials").fetchall()
        conn.execute("UPDATE registry_credentials SET secret = ?",
                     (load_key(key).seal("x", "another row"),))
    finding = check()
    assert finding.status == "fail" and "does not open the newest" in finding.summary, finding
    with sqlite3.connect(db) as conn:
        conn.executemany("UPDATE registry_credentials SET secret = ? WHERE registry = ?",
                         [(secret, registry) for registry, secret in saved])
    assert check().status == "ok"

    key.chmod(0o644)
    finding = check()
    assert finding.status == "fail" and "readable by others" in finding.summary, finding
    assert finding.fix == f"chmod 600 {key}"
    key.chmod(0o600)
    os.chown(key, 4242, 4242)  # root (these tests') reads it anyway; the server's user may not
    finding = check()
    assert finding.status == "warn" and "owned by uid 4242" in finding.summary, finding
    assert finding.fix.startswith(f"chown {os.geteuid()} {key}")
    os.chown(key, os.geteuid(), os.getegid())
    key.write_text("c2hvcnQ=\n")  # base64, 5 bytes
    assert check().status == "fail" and "not 32 bytes of base64" in check().summary

    key.unlink()  # the key gone while credentials remain: builds that need them fail
    finding = check()
    assert finding.status == "fail" and "holds 2 registry credentials" in finding.summary
    assert "cannot serve image builds" in finding.summary and "backup" in finding.fix
    assert make_key_file(key)  # a new key (setup again): it sealed none of them
    finding = check()
    assert finding.status == "fail", finding
    assert "did not seal 2 of the 2 stored credentials" in finding.summary
    assert "cannot serve image builds" in finding.summary and "log in again" in finding.fix
    assert "hunter2" not in json.dumps(as_json([finding]))
    # A database that does not answer: the key is still checked; the database check fails.
    ctx.settings = Settings(home=tmp_path, db_url=f"postgresql://d:pw@127.0.0.1:{free_port()}/x")
    finding = check()
    assert finding.status == "ok" and "stored credentials not checked" in finding.summary


def test_reflink_probe_tells_xfs_from_tmpfs_and_leaves_nothing(tmp_path: Path) -> None:
    """On an XFS made with reflink=1 (loop-mounted in a mount namespace of its own, so that
    nothing outlives the test), and on tmpfs, which has none."""
    image, mnt = tmp_path / "xfs.img", tmp_path / "mnt"
    mnt.mkdir()
    with image.open("wb") as f:
        f.truncate(320 << 20)  # XFS's smallest
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True, timeout=60)
    probe = ("from pathlib import Path; import sys; from pandastack.cli.doctor_host import "
             "reflinks_work as r; p = Path(sys.argv[1]); print(r(p), list(p.iterdir()))")
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount -o loop "$1" "$2" && exec "$3" -c "$4" "$2"', "sh",
                          str(image), str(mnt), sys.executable, probe],
                         capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert out.stdout.strip() == "True []", out.stderr
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        assert hostchk.reflinks_work(shm) is False
        assert list(shm.iterdir()) == []
    finally:
        shm.rmdir()


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PANDASTACK_")}
    return subprocess.run([str(PANDASTACK), "doctor", "--json", *args],
                          env={**base, **env}, capture_output=True, text=True, timeout=120,
                          check=False)


def test_doctor_for_real_reports_a_wrong_database_and_a_taken_port(
        held_port: int, postgres: Postgres, s3_env: dict[str, str]) -> None:
    """The whole command on this machine (the probe boot included): every check answers,
    and the two broken settings fail with a fix; the exit status says the host cannot
    serve. Then this machine as it is (it serves: the tests boot VMs here) passes: `serve`'s
    role with the session's real PostgreSQL and S3 server, the agent's role with its probe's
    verdict just cached, each exit 0."""
    out = _doctor({"PANDASTACK_PORT": str(held_port),
                   "PANDASTACK_DB": f"postgresql://doctor:pw@127.0.0.1:{free_port()}/none"})
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"can_serve", "counts", "checks"} and doc["can_serve"] is False
    checks = {c["check"]: c for c in doc["checks"]}
    assert list(checks) == [spec.name for spec in CHECKS]
    for c in doc["checks"]:
        assert set(c) == {"check", "status", "summary", "fix"}
        assert c["status"] in ("ok", "warn", "fail") and c["summary"]
        assert c["status"] == "ok" or c["fix"]
    assert checks["database"]["status"] == "fail" and "PANDASTACK_DB" in checks["database"]["fix"]
    assert checks["ports"]["status"] == "fail" and str(held_port) in checks["ports"]["summary"]
    assert "bug" not in json.dumps(doc)  # no check broke
    assert sum(doc["counts"].values()) == len(CHECKS)

    with postgres.database() as dsn:
        good = _doctor({**s3_env, "PANDASTACK_PORT": str(free_port()),
                        "PANDASTACK_PREVIEW_PORT": "0", "PANDASTACK_DB": dsn,
                        "PANDASTACK_OBJECT_STORE": f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/doc"},
                       "--role", "serve")
    doc = json.loads(good.stdout)
    checks = {c["check"]: c for c in doc["checks"]}
    assert checks["database"]["status"] == "ok", checks["database"]
    assert checks["object store"]["status"] == "ok", checks["object store"]
    assert good.returncode == 0 and doc["can_serve"] is True, doc
    agent = _doctor({}, "--role", "agent", "--quick")
    doc = json.loads(agent.stdout)
    assert agent.returncode == 0 and doc["can_serve"] is True, doc
    assert "database" not in {c["check"] for c in doc["checks"]}


def test_a_malformed_setting_fails_and_roles_limit_the_checks(tmp_path: Path) -> None:
    env_file = tmp_path / "pandastack.env"
    env_file.write_text("PANDASTACK_PORT=eighty\n")
    out = _doctor({}, "--quick", "--role", "serve", "--env-file", str(env_file))
    assert out.returncode == 1
    checks = {c["check"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["settings"]["status"] == "fail" and "PANDASTACK_PORT" in \
        checks["settings"]["summary"]
    assert "accelerator" not in checks and "database" in checks


def test_human_output_names_each_check_and_its_fix(held_port: int) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PANDASTACK_")}
    out = subprocess.run([sys.executable, "-m", "pandastack", "doctor", "--quick", "--role",
                          "serve"], env={**base, "PANDASTACK_PORT": str(held_port)},
                         capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert out.returncode == 1
    assert "fail  ports" in out.stdout and "fix: stop what listens there" in out.stdout
    assert "this host cannot serve: ports failed" in out.stdout
