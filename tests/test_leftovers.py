"""The reaper of killed runs' leftovers (tests/leftovers.py): which names it takes for whose
(its decision, from names and live pids alone), and, for real, that it stops and removes
what a process killed with SIGKILL left (a directory with a process working in it, a
namespace with a process inside) while the same kinds of a live owner stay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.host.network.manager import list_netns
from tests.leftovers import (
    DIR_KINDS,
    NETNS_OWNER,
    claims_under,
    dead_owned,
    owned_tmpdir,
    reap,
    users_of,
)

LIVE = {100, 4242}


def test_a_directory_goes_when_the_pid_in_its_name_is_gone() -> None:
    names = ["pst-4242-abcd1234", "pst-4242-abcd1234-snapshots",  # live owner
             "pst-77-x1y2z3w4", "pst-77-x1y2z3w4-snapshots", "pst-77-x1y2z3w4-volumes",
             "psp-78-qq", "pandastack-s3-79-zz", "pst-crash-80-aa", "psf-snap-81-bb",
             "ps-chromium-82-cc", "psf-100-dd"]
    assert dead_owned(names, LIVE) == sorted([
        "pst-77-x1y2z3w4", "pst-77-x1y2z3w4-snapshots", "pst-77-x1y2z3w4-volumes",
        "psp-78-qq", "pandastack-s3-79-zz", "pst-crash-80-aa", "psf-snap-81-bb",
        "ps-chromium-82-cc"])


def test_names_without_an_owner_stay() -> None:
    names = [
        "pst-36v7z7dv", "pst-36v7z7dv-snapshots",  # made before names carried a pid
        "pandastack-quiet", "pandastack-artifacts", "pandastack-s3-8bdj0eva",
        "pandastack-sdk-ts-077d07b12100ac01.lock",  # not a kind of ours
        "psa-77-xx", "tmp-77-xx", "pytest-of-root", "pst-0-xx", "pst-77",  # no such kind/pid
        "pst-crash-x77-aa", "psnx-77-aa",
    ]
    assert dead_owned(names, LIVE) == []


def test_namespaces_carry_the_pid_at_their_end() -> None:
    names = ["pst-inet-77", "pse-inet-78", "pst-inet-4242", "psn-77", "psn-16087",
             "pst-inet-77-x", "pcl-a"]
    assert dead_owned(names, LIVE, NETNS_OWNER) == ["pse-inet-78", "pst-inet-77"]


def test_users_are_processes_naming_or_working_in_a_directory() -> None:
    dirs = [Path("/tmp/pst-77-abcd1234"), Path("/tmp/psp-78-qq")]
    procs = [
        (10, ["qemu-system-x86_64", "-chardev", "socket,path=/tmp/pst-77-abcd1234/s/qmp.sock"],
         "/"),
        (11, ["postgres: checkpointer"], "/tmp/psp-78-qq/data"),
        (12, ["bash"], "/tmp/psp-78-qq"),
        (13, ["qemu-system-x86_64", "/tmp/pst-4242-abcd1234/s/disk"], "/"),  # a live owner's
        (14, ["ls", "/tmp"], "/tmp/psp-78-qqq"),  # another directory
        (15, ["python", "/tmp/pst-77-abcd1234"], "/"),  # the reaper itself
    ]
    assert users_of(dirs, procs, me=15) == [10, 11, 12]


def test_network_slots_go_with_the_directories_their_owners_were_in() -> None:
    claims = {1: "/tmp/pst-77-abcd1234/sbx-1", 2: "/tmp/pst-77-abcd1234/.spare-slots",
              3: "/tmp/pst-77-abcd1234-snapshots", 4: "/tmp/pst-4242-abcd1234/sbx-2",
              5: "/tmp/pst-77-abcd1234"}
    assert claims_under(claims, [Path("/tmp/pst-77-abcd1234")]) == [1, 2, 5]


def test_only_known_kinds_are_made() -> None:
    assert all(k.endswith("-") for k in DIR_KINDS)
    with pytest.raises(ValueError, match="DIR_KINDS"):
        owned_tmpdir("unknown-")


# -- for real ------------------------------------------------------------------------------

OWNER = """
import os, subprocess, sys
from tests.leftovers import owned_tmpdir
d = owned_tmpdir("psk-")
ns = f"pst-inet-{os.getpid()}"
subprocess.run(["ip", "netns", "add", ns], check=True)
# Children that outlive the owner: one working in its directory, one in its namespace.
a = subprocess.Popen(["sleep", "600"], cwd=d, start_new_session=True)
b = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"], start_new_session=True)
print(d, ns, a.pid, b.pid, flush=True)
sys.stdin.read()
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie waits for its parent (init here) to reap it: it is dead


@pytest.fixture
def killed_owner() -> Iterator[tuple[Path, str, list[int]]]:
    """What a process made before it was killed with SIGKILL."""
    if os.geteuid() != 0:
        pytest.skip("makes a network namespace (root)")
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    assert owner.stdout is not None
    d, ns, *pids = owner.stdout.readline().split()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    try:
        yield Path(d), ns, [int(p) for p in pids]
    finally:  # whatever the reaper did not
        for argv in (["kill", "-9", *pids], ["ip", "netns", "del", ns], ["rm", "-rf", d]):
            subprocess.run(argv, capture_output=True, check=False)


@pytest.mark.timeout(120)
def test_what_a_killed_process_left_goes_and_a_live_ones_stays(
        killed_owner: tuple[Path, str, list[int]]) -> None:
    d, ns, pids = killed_owner
    mine = owned_tmpdir("psk-")
    try:
        assert d.is_dir() and ns in list_netns() and all(alive(p) for p in pids)
        reaped = reap()
        assert d in reaped.dirs and ns in reaped.netns
        assert set(pids) <= set(reaped.processes)
        assert not d.exists() and ns not in list_netns()
        assert not any(alive(p) for p in pids)
        assert mine.is_dir() and mine not in reaped.dirs
    finally:
        mine.rmdir()
