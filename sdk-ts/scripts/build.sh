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
want=$(sha256sum package-lock.json | cut -d' ' -f1)
stamp=node_modules/.pandastack-lock-sha256
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
rm -rf dist
npx --no-install tsc -p tsconfig.json
