#!/usr/bin/env bash
# Builds (or finds) E2B's SDKs at the versions the tests pin, outside the repo, keyed by what
# pins them: a venv with Python e2b 2.45.1 (before /v2) and e2b-code-interpreter 2.10.0
# (tests/e2e/e2b_clients/python-e2b-2.45.1.txt, also what scripts/e2b-suite.py runs E2B's
# suite under), and a node_modules with e2b 2.51.0 and @e2b/code-interpreter 2.8.0 (npm ci from
# tests/e2e/e2b_clients/package-lock.json). The newest Python SDK is in the dev extras instead.
#
#   scripts/e2b-sdks.sh [python|node]...   (both when none named)
#
# prints `E2B_SDK_PYTHON=<venv>/bin/python` and `E2B_SDK_NODE_MODULES=<dir>` lines. A build is
# reused while its pin file, the interpreter's version and this script are unchanged; a half
# build (no stamp) is removed and redone; older keys are pruned. Under a lock, so two test
# workers asking at once build once. Needs PyPI and npm reachable the first time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
clients=$root/tests/e2e/e2b_clients
cache=${PANDASTACK_HOME:-/var/lib/pandastack}/cache/e2b-sdks
py=${PY:-python3}
want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(python node)

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key() {  # 16 hex digits of everything that decides a build's content
  cat "$@" "$0" | sha256sum | cut -c1-16
}

prune() {  # the other builds of one kind: a pin changed, they will not be used again
  local kind=$1 keep=$2 d
  for d in "$cache/$kind"-*; do
    [[ -e $d && $d != "$keep" ]] && rm -rf "$d"
  done
  return 0
}

build_python() {
  local version k dir
  version=$("$py" -c 'import sys; print(sys.version)')
  k=$(key "$clients/python-e2b-2.45.1.txt" <(echo "$version"))
  dir=$cache/python-$k
  if [[ ! -f $dir/.complete ]]; then
    rm -rf "$dir"
    "$py" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check --no-deps \
      -r "$clients/python-e2b-2.45.1.txt" >&2
    # --no-deps takes the list as the whole truth; pip check says if the list missed one.
    "$dir/bin/pip" check >&2
    touch "$dir/.complete"
    prune python "$dir"
  fi
  echo "E2B_SDK_PYTHON=$dir/bin/python"
}

build_node() {
  local k dir
  if ! command -v npm >/dev/null; then
    echo "e2b-sdks: npm is missing (scripts/host-deps.sh installs nodejs and npm)" >&2
    exit 1
  fi
  k=$(key "$clients/package.json" "$clients/package-lock.json" <(node --version))
  dir=$cache/node-$k
  if [[ ! -f $dir/.complete ]]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$clients/package.json" "$clients/package-lock.json" "$dir/"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
    touch "$dir/.complete"
    prune node "$dir"
  fi
  echo "E2B_SDK_NODE_MODULES=$dir/node_modules"
}

for kind in "${want[@]}"; do
  case $kind in
    python) build_python ;;
    node) build_node ;;
    *) echo "e2b-sdks: unknown kind '$kind' (python or node)" >&2; exit 2 ;;
  esac
done
