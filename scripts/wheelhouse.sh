#!/usr/bin/env bash
# Wheels of everything `pip install '.[server]'` needs besides the project itself (its
# dependencies and build backend), so that tests/docs/test_install_guide.py can run the
# install of docs/operations.md with no index and no network.
#
#   wheelhouse.sh path        print the directory (it may not exist yet)
#   wheelhouse.sh fill PIP    fill it with PIP (`make wheelhouse`; network), once per key
#
# Outside the repository (a copy of it must not carry ~60 MB of wheels), keyed by what
# decides its content: pyproject.toml, and python3's version and machine, since the doc's
# venv is `python3 -m venv` and wheels are per interpreter and platform.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
key="$({ cat "$root/pyproject.toml"
         python3 -c 'import platform, sys; print(sys.version_info[:2], platform.machine())'
       } | sha256sum | cut -c1-16)"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/pandastack/wheelhouse/$key"

case "${1:-}" in
  path)
    echo "$dir"
    ;;
  fill)
    pip="${2:?usage: wheelhouse.sh fill PIP}"
    [[ -d "$dir" ]] && exit 0
    mkdir -p "$(dirname "$dir")"
    tmp="$(mktemp -d "$dir.partial.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    # The requirements read from pyproject.toml, not `pip wheel .[server]`: that would build
    # the project in the checkout (build/, egg-info) and put a wheel of it here that goes
    # stale as the sources change.
    python3 - "$root/pyproject.toml" >"$tmp/requirements.txt" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    doc = tomllib.load(f)
project = doc["project"]
print("\n".join([*project["dependencies"], *project["optional-dependencies"]["server"],
                 *doc["build-system"]["requires"]]))
EOF
    # --python: the wheels must suit python3, whichever interpreter PIP belongs to.
    "$pip" --python "$(command -v python3)" wheel -q --wheel-dir "$tmp" \
      -r "$tmp/requirements.txt"
    rm "$tmp/requirements.txt"
    # Complete or absent: the test takes the directory's existence as "filled".
    mv -T "$tmp" "$dir"
    trap - EXIT
    echo "wheelhouse: $(ls "$dir" | wc -l) wheels in $dir"
    ;;
  *)
    echo "usage: wheelhouse.sh path | fill PIP" >&2
    exit 2
    ;;
esac
