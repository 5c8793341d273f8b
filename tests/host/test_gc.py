"""Old template versions and images are removed, but never while a VM uses them; VMMs whose
directory is gone are killed. The VMMs here are lookalikes of the fake driver's (any known
driver's processes count: tests/host/vmm/test_factory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from pandastack.host.gc import kill_orphan_vmms, prune_images, prune_templates
from pandastack.host.vmm.driver import read_cmdline
from tests.host.fake_vmm import MARK, lookalike


def _version(root: Path, name: str, key: str, image_key: str, age: float) -> Path:
    path = root / name / key
    path.mkdir(parents=True)
    (path / "memory").write_bytes(b"x")
    (path / "template.json").write_text(json.dumps({"image_key": image_key}))
    old = time.time() - age
    os.utime(path, (old, old))
    return path


def test_prunes_unused_old_versions_only(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    current = _version(templates, "base", "new", "img-new", age=0)
    stale = _version(templates, "base", "stale", "img-stale", age=3600)
    fresh = _version(templates, "base", "fresh", "img-fresh", age=5)
    busy = _version(templates, "base", "busy", "img-busy", age=3600)
    # A process that looks like a VMM using `busy`'s memory file.
    vmm = lookalike("--memory", f"{busy}/memory")
    try:
        removed = prune_templates(templates, [current], progress=lambda m: None)
    finally:
        vmm.kill()
        vmm.wait()
    assert removed == [stale]
    assert current.exists() and fresh.exists() and busy.exists() and not stale.exists()

    images = tmp_path / "images"
    for key in ("img-new", "img-stale", "img-fresh", "img-busy", "img-orphan", "img-current"):
        (images / key).mkdir(parents=True)
        old = time.time() - 3600
        os.utime(images / key, (old, old))
    gone = prune_images(images, templates, ["img-current"], progress=lambda m: None)
    assert sorted(p.name for p in gone) == ["img-orphan", "img-stale"]
    assert sorted(p.name for p in images.iterdir()) == [
        "img-busy", "img-current", "img-fresh", "img-new"]


def test_prune_limited_to_named_templates(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    current = _version(templates, "base", "new", "img-base", age=0)
    stale = _version(templates, "base", "stale", "img-stale", age=3600)
    node = _version(templates, "node", "current", "img-node", age=3600)
    removed = prune_templates(templates, [current], names=["base"], progress=lambda m: None)
    assert removed == [stale]
    assert node.exists()


def _lookalike(workdir: Path) -> subprocess.Popen[bytes]:
    """A process whose command line looks like a pandastack VMM of `workdir`."""
    return lookalike("--workdir", str(workdir), "--agent-socket", f"{workdir}/agent.sock")


def test_vmms_whose_directory_is_gone_are_killed(tmp_path: Path) -> None:
    owned, orphaned = tmp_path / "sbx-000000000001", tmp_path / "sbx-000000000002"
    owned.mkdir()
    orphaned.mkdir()
    keep, orphan = _lookalike(owned), _lookalike(orphaned)
    try:
        orphaned.rmdir()  # as after a crash between the VMM's kill and the directory's removal
        killed = [pid for pid, _ in kill_orphan_vmms(progress=lambda m: None)]
        assert orphan.pid in killed and keep.pid not in killed
        assert orphan.wait(timeout=5) == -9
        assert keep.poll() is None
    finally:
        for proc in (keep, orphan):
            proc.kill()
            proc.wait()


def test_a_version_used_through_a_symlinked_home_is_kept(tmp_path: Path) -> None:
    """An agent of `make cluster` reaches the shared templates through a symlink in its own
    home: its VMMs name them by that path, and another runtime's GC must still see them."""
    templates = tmp_path / "templates"
    current = _version(templates, "base", "new", "img-new", age=0)
    busy = _version(templates, "base", "busy", "img-busy", age=3600)
    other_home = tmp_path / "agent-home"
    other_home.mkdir()
    (other_home / "templates").symlink_to(templates)
    vmm = lookalike("-object", f"memory-backend-file,mem-path={other_home}/templates/base/busy"
                    "/memory,share=off")
    try:
        removed = prune_templates(templates, [current], progress=lambda m: None)
    finally:
        vmm.kill()
        vmm.wait()
    assert removed == [] and busy.exists()


def test_a_vmm_whose_directory_only_its_mount_namespace_sees_is_not_killed(
        tmp_path: Path) -> None:
    """An agent with private mounts may keep its VM directories where other runtimes cannot
    see them: no other runtime may take its VMMs for orphans."""
    private = tmp_path / "private"
    private.mkdir()
    workdir = private / "sbx-000000000003"
    ready = tmp_path / "ready"
    script = (f"mount -t tmpfs none {private} && mkdir {workdir} && touch {ready} && "
              f"exec /bin/sh -c 'sleep 300; true' {MARK} "
              f"--workdir {workdir} --agent-socket {workdir}/agent.sock")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script])
    try:
        deadline = time.monotonic() + 10
        while MARK not in read_cmdline(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert ready.exists() and not workdir.exists()  # only its namespace has it
        killed = [pid for pid, _ in kill_orphan_vmms(progress=lambda m: None)]
        assert proc.pid not in killed and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9


def test_a_version_another_process_has_loaded_is_kept_until_it_exits(tmp_path: Path) -> None:
    """Two runtimes on one host may use different versions of one template (a setting that
    changes its key); one's prune must not remove the version the other loaded, even with no
    VM of the other's running from it at that moment."""
    import sys

    templates = tmp_path / "templates"
    current = _version(templates, "base", "mine", "img-a", age=0)
    theirs = _version(templates, "base", "theirs", "img-b", age=3600)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, pathlib; from pandastack.host.gc import hold_version;"
         f" assert hold_version(pathlib.Path({str(theirs)!r})); print('held', flush=True);"
         " sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert prune_templates(templates, [current], progress=lambda m: None) == []
        assert theirs.exists()
    finally:
        holder.communicate("", timeout=30)
    # the hold renewed its mtime (the grace covers a moment with no holder): let it pass
    assert time.time() - theirs.stat().st_mtime < 60
    assert prune_templates(templates, [current], progress=lambda m: None) == []
    old = time.time() - 3600
    os.utime(theirs, (old, old))
    assert prune_templates(templates, [current], progress=lambda m: None) == [theirs]
    assert not theirs.exists() and current.exists()


def test_an_abandoned_bake_and_its_vm_both_go(tmp_path: Path) -> None:
    """A baker SIGKILLed mid-bake leaves its `.tmp-PID` directory and the VM it was baking;
    the VM's command line named the directory, so the GC kept both for good (two such QEMUs
    ran for 45 minutes after a cluster test here)."""
    templates = tmp_path / "templates"
    current = _version(templates, "base", "new", "img-new", age=0)
    dead_pid = 2**22 + 12345  # above the kernel's pid_max here: no such process
    abandoned = templates / "base" / f"half.tmp-{dead_pid}"
    abandoned.mkdir()
    vmm = lookalike("--memory", f"{abandoned}/memory")
    try:
        removed = prune_templates(templates, [current], progress=lambda m: None)
        assert vmm.wait(timeout=10) == -9
    finally:
        if vmm.poll() is None:
            vmm.kill()
            vmm.wait()
    assert removed == [abandoned] and not abandoned.exists() and current.exists()
