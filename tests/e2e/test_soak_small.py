"""The soak script (bench/soak.py, issue 22) at a small size: 20 create -> write -> exec ->
read -> kill cycles from 2 clients against its own live server must end with no error and
nothing left; and its leftover check must see what a run leaves behind (checked on a
directory made to look like one, no VM)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import soak  # noqa: E402  (bench/ is not a package)
from tests.helpers import vmm_pids_under  # noqa: E402


def test_twenty_cycles_from_two_clients_end_without_errors_or_leftovers() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--cycles", "20", "--clients", "2",
         "--max-minutes", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "cycles done 20 of 20" in out, out[-4000:]
    assert "\nerrors 0\n" in out, out[-4000:]
    assert "leftovers with the server up: 0" in out, out[-4000:]
    assert "leftovers after its SIGTERM: 0" in out, out[-4000:]
    found = re.search(r"state under (\S+)", out)
    assert found is not None, out[-4000:]
    tmp = Path(found.group(1))
    assert not tmp.exists()
    assert not vmm_pids_under(tmp)


def test_the_leftover_check_names_files_rows_and_claims(tmp_path: Path) -> None:
    sandboxes = tmp_path / "server" / "sandboxes"
    (sandboxes / ".spare-slots").mkdir(parents=True)
    (sandboxes / "sbx-left").mkdir()
    db = tmp_path / "server" / "pandastack.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE sandboxes (id TEXT, state TEXT)")
        conn.executemany("INSERT INTO sandboxes VALUES (?, ?)",
                         [("a", "running"), ("b", "killed"), ("c", "starting")])
    conn.close()
    left = soak.leftovers(tmp_path, sandboxes, db, soak.Baseline.now(), stopped=False)
    assert f"file {sandboxes / 'sbx-left'}" in left
    assert "database row a in state running" in left
    assert "database row c in state starting" in left
    assert not [e for e in left if "row b" in e or ".spare-slots" in e]
