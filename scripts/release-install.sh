#!/usr/bin/env bash
# The newest release of pandastack, installed as an operator installs it (its tree's wheel
# in a venv of its own), for tests/server/hosts/test_cluster_upgrade.py, which upgrades a
# cluster from it to this tree (docs/releasing.md).
#
#   release-install.sh version        the newest release CHANGELOG.md dates
#   release-install.sh commit         its commit: the tag vX.Y.Z, or in a clone without tags
#                                     the commit that dated its section; exit 3 if neither
#                                     is in this clone (a shallow one)
#   release-install.sh fill PYTHON    install it (once per release and commit), print the
#                                     venv's python
#
# No network: the wheel is built with PYTHON's setuptools and the release's dependencies are
# taken from PYTHON's environment (a .pth after the venv's own site-packages), the way
# tests/guest/test_agent_wheel.py installs this tree's wheel. A release whose dependencies
# this tree's venv lacks needs its own (pip install into the venv from an index).
# Outside the repository: ~/.cache/pandastack/releases/<version>-<commit>/.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

version() {
  grep -m1 -oP '^## \[\K[0-9]+\.[0-9]+\.[0-9]+(?=\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$)' \
    "$root/CHANGELOG.md" || { echo "release-install: CHANGELOG.md dates no release" >&2; exit 3; }
}

commit() {
  local v="$1" c
  if c="$(git -C "$root" rev-parse -q --verify "refs/tags/v$v^{commit}")"; then
    echo "$c"; return
  fi
  # The commit whose diff added the dated heading (the oldest that touches it).
  c="$(git -C "$root" log --format=%H -G"^## \\[${v//./\\.}\\] - [0-9]" -- CHANGELOG.md \
       2>/dev/null | tail -1)"
  if [[ -z "$c" ]]; then
    echo "release-install: neither the tag v$v nor the commit that dated it is in this" \
         "clone (shallow?)" >&2
    exit 3
  fi
  echo "$c"
}

case "${1:-}" in
  version)
    version
    ;;
  commit)
    commit "$(version)"
    ;;
  fill)
    python="${2:?usage: release-install.sh fill PYTHON}"
    v="$(version)"
    c="$(commit "$v")"
    dir="${XDG_CACHE_HOME:-$HOME/.cache}/pandastack/releases/$v-${c:0:12}"
    if [[ ! -f "$dir/.complete" ]]; then
      rm -rf "$dir"  # what an interrupted fill left
      mkdir -p "$dir"
      git -C "$root" archive --format=tar --prefix=tree/ "$c" | tar -x -C "$dir"
      "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$dir/dist" "$dir/tree"
      "$python" -m venv --without-pip "$dir/venv"
      "$python" -m pip --python "$dir/venv/bin/python" install -q --no-deps --no-index \
        "$dir"/dist/pandastack-*.whl
      site="$(echo "$dir"/venv/lib/python3*/site-packages)"
      "$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
        >"$site/zz-deps.pth"
      rm -rf "$dir/tree" "$dir/dist"
      touch "$dir/.complete"
    fi
    echo "$dir/venv/bin/python"
    ;;
  *)
    echo "usage: release-install.sh version | commit | fill PYTHON" >&2
    exit 2
    ;;
esac
