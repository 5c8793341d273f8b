#!/usr/bin/env bash
# Installs the SDK's build tools exactly as package-lock.json pins them (`npm ci`) and compiles
# it (dist/). node_modules is reused while a stamp holds the lock file's hash: a changed lock
# reinstalls, an unchanged one costs nothing. `make test` and the Python tests that drive the
# SDK run this; it is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v npm >/dev/null; then
  echo "sdk-ts: npm is missing (scripts/host-deps.sh installs nodejs and npm)" >&2
  exit 1
fi
# Test modules on two pytest workers build at once (and read dist/ while the other builds):
# one build at a time, by a lock outside node_modules (which `npm ci` replaces), and dist/ is
# compiled again only when what tsc reads changed, so a reader's dist/ is never removed
# under it by a build of the same sources.
exec 9>"${TMPDIR:-/tmp}/pandastack-sdk-ts-$(pwd | sha256sum | cut -c1-16).lock"
flock 9
want=$(sha256sum package-lock.json | cut -d' ' -f1)
stamp=node_modules/.pandastack-lock-sha256
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
sources=$( (sha256sum package-lock.json package.json tsconfig.json
            find src test scripts -type f -name '*.ts' -print0 | sort -z | xargs -0 sha256sum
           ) | sha256sum | cut -d' ' -f1)
built=node_modules/.pandastack-dist-sha256
if [[ ! -d dist || "$(cat "$built" 2>/dev/null || true)" != "$sources" ]]; then
  rm -rf dist
  npx --no-install tsc -p tsconfig.json
  echo "$sources" > "$built"
fi
