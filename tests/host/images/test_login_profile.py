"""Guest images' /etc/profile (images/rootfs.py): a login bash takes its uid from $EUID instead
of forking `id -u` (E2B's SDKs start every command as `bash -l -c`), and any shell still gets
the PATH the uid picks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pandastack.host.images.rootfs import login_profile_without_id_fork

# Debian 12's /etc/profile, as base-files ships it (the part that picks PATH by uid)
DEBIAN_PROFILE = """\
if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
fi
export PATH

if [ "${PS1-}" ]; then
  if [ "${BASH-}" ] && [ "$BASH" != "/bin/sh" ]; then
    :
  else
    if [ "$(id -u)" -eq 0 ]; then
      PS1='# '
    else
      PS1='$ '
    fi
  fi
fi
"""
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"


def _source(shell: str, profile: Path) -> tuple[str, str]:
    """(PATH after sourcing `profile` with `shell -x`, its trace)."""
    out = subprocess.run([shell, "-x", "-c", f'. {profile}; printf %s "$PATH"'],
                         capture_output=True, text=True, timeout=30, check=True,
                         env={"PATH": os.environ["PATH"]})
    return out.stdout, out.stderr


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_the_profile_picks_the_same_path_and_bash_forks_no_id(tmp_path: Path,
                                                              shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} on this host")
    profile = tmp_path / "profile"
    profile.write_text(DEBIAN_PROFILE)
    before, before_trace = _source(shell, profile)
    login_profile_without_id_fork(profile)
    after, trace = _source(shell, profile)
    assert before == after == (ROOT_PATH if os.geteuid() == 0 else USER_PATH)
    assert "id -u" in before_trace
    # bash reads $EUID; dash has none and still asks id
    assert ("id -u" in trace) is (shell == "dash")
    assert profile.read_text().count("${EUID:-$(id -u)}") == 2


def test_an_image_without_a_profile_is_left_alone(tmp_path: Path) -> None:
    login_profile_without_id_fork(tmp_path / "profile")
    assert not (tmp_path / "profile").exists()
