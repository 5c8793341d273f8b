"""E2B's own Python SDK tests against pandastack: the conformance yardstick of docs/e2b.md.

    .venv/bin/python scripts/e2b-suite.py PATH/TO/E2B/packages/python-sdk/tests
        [--api-url URL --sandbox-url URL --api-key KEY] [--workers N] [--folders ...]
        [--junit FILE] [-- extra pytest arguments]

The suite is someone else's code: it is never copied into this repo; point the script at a
checkout of e2b-dev/E2B (the measure is commit b8029973, written for SDK 2.45.1). It runs the
suite's `{sync,async}/sandbox_*` and `api_*` folders with the venv of scripts/e2b-sdks.sh
(e2b 2.45.1), against a `pandastack serve` it starts in a temporary state directory (as root,
booting real VMs) unless --api-url names a running one, leaving out only the tests listed in
DESELECTED, each with its reason. It prints the pass rate per folder and every failure's test
id with its first error line; the exit status is 0 only if nothing failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("sync/sandbox_sync", "sync/api_sync", "async/sandbox_async", "async/api_async")

# Tests left out, by file (under each of sandbox_sync and sandbox_async) and name. Only tests
# that reach public hosts or assert E2B's own cloud URLs: nothing may leave this machine, and
# pandastack's answer to what they check is tested by our own tests instead.
INTERNET = "reaches a public host from inside the sandbox (connectivitycheck.gstatic.com)"
PUBLIC_IPS = "network rules tried against public addresses (curl to 1.1.1.1 / 8.8.8.8)"
CLOUD_HOST = ("fetches https://{port}-{sandbox id}.{domain} from the test process: E2B's cloud "
              "(e2b.app) here; pandastack answers such names only behind wildcard DNS and TLS")
DESELECTED: dict[tuple[str, str], str] = {
    ("test_internet_access.py", "test_internet_access_enabled"): INTERNET,
    ("test_internet_access.py", "test_internet_access_disabled"): INTERNET,
    ("test_internet_access.py", "test_internet_access_default"): INTERNET,
    ("test_network.py", "test_allow_specific_ip_with_deny_all"): PUBLIC_IPS,
    ("test_network.py", "test_deny_specific_ip"): PUBLIC_IPS,
    ("test_network.py", "test_deny_all_traffic"): PUBLIC_IPS,
    ("test_network.py", "test_allow_takes_precedence_over_deny"): PUBLIC_IPS,
    ("test_network.py", "test_update_network_applies_restrictions"): PUBLIC_IPS,
    ("test_network.py", "test_update_network_clears_existing_rules"): PUBLIC_IPS,
    ("test_network.py", "test_allow_public_traffic_false"): CLOUD_HOST,
    ("test_network.py", "test_allow_public_traffic_true"): CLOUD_HOST,
    ("test_network.py", "test_mask_request_host"): CLOUD_HOST,
    ("test_network.py", "test_firewall_transform_injects_headers"):
        CLOUD_HOST + "; and a sidecar of E2B's `httpbin` template",
    ("test_host.py", "test_ping_server"): CLOUD_HOST,
    ("test_create.py", "test_auto_resume_wakes_on_http_request"): CLOUD_HOST,
    ("test_config_propagation.py", "test_connect_sets_stable_host_routing_headers"):
        "asserts E2B's cloud daemon URL https://sandbox.e2b.app (E2B_SANDBOX_URL replaces it)",
}


@dataclass(frozen=True)
class Target:
    api_url: str
    sandbox_url: str
    api_key: str


def main() -> int:
    args, extra = parse_args()
    tests = Path(args.tests).resolve()
    if not (tests / "conftest.py").is_file() or not (tests / "sync").is_dir():
        sys.exit(f"{tests}: not E2B's packages/python-sdk/tests (no conftest.py and sync/)")
    python = sdk_python()
    with tempfile.TemporaryDirectory(prefix="pse2b-suite-") as work, target(args) as where:
        junit = Path(args.junit) if args.junit else Path(work) / "junit.xml"
        folders = args.folders or list(FOLDERS)
        code = run_suite(python, tests, folders, where, junit, args.workers, extra)
        if not junit.exists():
            print(f"pytest wrote no report (exit {code})")
            return 1
        failed = summarize(junit, tests, folders)
        return 0 if code == 0 and not failed else 1


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("tests", help="E2B's packages/python-sdk/tests")
    p.add_argument("--api-url", help="a running server's API (default: start one)")
    p.add_argument("--sandbox-url", help="its sandbox-port listener (default: API port + 1)")
    p.add_argument("--api-key", help="a key of that server (pandastack's or its e2b_ alias)")
    p.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (default 1)")
    p.add_argument("--folders", nargs="+", help=f"a subset of {', '.join(FOLDERS)}")
    p.add_argument("--junit", help="keep pytest's JUnit XML report here")
    return p.parse_args(argv), extra


def sdk_python() -> str:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "e2b-sdks.sh"), "python"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)["E2B_SDK_PYTHON"]


def e2b_alias(key: str) -> str:
    """SDK 2.45.1 refuses a key not shaped `e2b_<hex>` before sending it: the server's alias
    of our key in that form (compat/e2b/rest/base.py)."""
    from pandastack.server.compat.e2b.rest.base import e2b_key
    return key if key.startswith("e2b_") else e2b_key(key)


@contextmanager
def target(args: argparse.Namespace) -> Iterator[Target]:
    if args.api_url:
        if not args.api_key:
            sys.exit("--api-url needs --api-key")
        api = args.api_url.rstrip("/")
        port = int(api.rsplit(":", 1)[1]) if api.count(":") == 2 else 80
        sandbox = args.sandbox_url or f"{api.rsplit(':', 1)[0]}:{port + 1}"
        yield Target(api, sandbox, e2b_alias(args.api_key))
        return
    with served() as where:
        yield where


@contextmanager
def served() -> Iterator[Target]:
    """`pandastack serve` on free loopback ports, its state in a directory of its own."""
    tmp = Path(tempfile.mkdtemp(prefix="pse2b-serve-", dir="/tmp"))
    port, sandbox_port = free_port(), free_port()
    env = {**os.environ,
           "PANDASTACK_STATE_DIR": str(tmp / "sandboxes"),
           "PANDASTACK_SNAPSHOTS_DIR": str(tmp / "snapshots"),
           "PANDASTACK_DB": f"sqlite:///{tmp / 'pandastack.db'}",
           "PANDASTACK_CLIENT_CONFIG": str(tmp / "client.json"),
           "PANDASTACK_PREVIEW_PORT": str(sandbox_port)}
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pandastack.cli.main", "serve", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(api, proc, log_path)
        key = json.loads((tmp / "client.json").read_text())["api_key"]
        print(f"serving on {api} (sandboxes http://127.0.0.1:{sandbox_port}); log {log_path}",
              flush=True)
        yield Target(api, f"http://127.0.0.1:{sandbox_port}", e2b_alias(key))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.environ.get("PANDASTACK_KEEP_SUITE_STATE"):
            print(f"state kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(api: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 600  # a first start may bake the base template
    while True:
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("the server did not come up:\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(0.2)


def run_suite(python: str, tests: Path, folders: list[str], where: Target, junit: Path,
              workers: int, extra: list[str]) -> int:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "E2B_API_URL": where.api_url, "E2B_SANDBOX_URL": where.sandbox_url,
           "E2B_API_KEY": where.api_key,
           # sync/ and async/ hold files of the same names: importlib mode imports each by
           # its path, and the conftest's helper modules are found beside it.
           "PYTHONPATH": str(tests)}
    deselect = [f"--deselect={folder}/{file}::{name}" for folder in folders
                for (file, name) in DESELECTED if (tests / folder / file).exists()]
    argv = [python, "-m", "pytest", *folders, f"--rootdir={tests}", f"--confcutdir={tests}",
            "-p", "no:cacheprovider", "--import-mode=importlib", "-o", "asyncio_mode=auto",
            "-o", "asyncio_default_fixture_loop_scope=function",
            "-o", "junit_family=xunit1", "-o", "markers=skip_debug",
            f"--junitxml={junit}", "--timeout=600", "-q", "-rN", "--no-header", *deselect, *extra]
    if workers > 1:
        argv += ["-n", str(workers)]
    print(f"running {len(folders)} folders, {len(deselect)} tests left out "
          f"(scripts/e2b-suite.py DESELECTED)", flush=True)
    return subprocess.run(argv, cwd=tests, env=env).returncode


def summarize(junit: Path, tests: Path, folders: list[str]) -> list[str]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    failures: list[tuple[str, str]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        test_id = f"{file}::{case.get('name')}"
        folder = next((f for f in sorted(folders, key=len, reverse=True)
                       if file.startswith(f + "/")), Path(file).parent.as_posix())
        sub = Path(file).parent.as_posix()
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "errors"}.get(tag, tag)
                if tag != "skipped":
                    failures.append((test_id, first_line(found)))
                break
        counts[folder][outcome] += 1
        if sub != folder:
            counts[sub][outcome] += 1
    for folder in folders:
        counts[folder]["deselected"] = sum(
            1 for (file, _name) in DESELECTED if (tests / folder / file).exists())
    print()
    print(f"{'folder':36} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7} "
          f"{'left out':>8} {'pass rate':>9}")
    total: Counter[str] = Counter()
    for folder in sorted(counts, key=lambda f: (next(
            (i for i, top in enumerate(folders) if f.startswith(top)), 99), f)):
        c = counts[folder]
        if folder in folders:
            total.update(c)
        name = folder if folder in folders else "  " + folder
        print(f"{name:36} {c['passed']:6} {c['failed']:6} {c['errors']:6} {c['skipped']:7} "
              f"{c['deselected']:8} {rate(c):>9}")
    print(f"{'all':36} {total['passed']:6} {total['failed']:6} {total['errors']:6} "
          f"{total['skipped']:7} {total['deselected']:8} {rate(total):>9}")
    if failures:
        print(f"\n{len(failures)} failed:")
        for test_id, line in failures:
            print(f"  {test_id}\n      {line}")
    return [t for t, _ in failures]


def rate(c: Counter[str]) -> str:
    ran = c["passed"] + c["failed"] + c["errors"]
    return f"{100 * c['passed'] / ran:.1f} %" if ran else "-"


def first_line(element: ET.Element) -> str:
    message = (element.get("message") or element.text or "").strip()
    return (message.splitlines() or [""])[0][:300]


if __name__ == "__main__":
    sys.exit(main())
