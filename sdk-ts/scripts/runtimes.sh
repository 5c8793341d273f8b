#!/usr/bin/env bash
# Fetches Bun and Deno, pinned, from the npm registry (their platform packages carry the
# binaries: @oven/bun-linux-x64-baseline, @deno/linux-x64-glibc) into a cache outside the repo
# keyed by version, and prints `name path` for each one it has. Nothing else is contacted:
# `npm pack` goes through npm's configured registry, and no install script runs.
# tests/sdk/test_ts_runtimes.py runs the SDK's smoke script under each binary printed.
set -euo pipefail

BUN_VERSION=1.4.5
DENO_VERSION=2.9.6
cache="${PANDASTACK_JS_RUNTIMES:-${XDG_CACHE_HOME:-$HOME/.cache}/pandastack/js-runtimes}"

fetch() {  # name package version binary-inside-the-package
  local name=$1 package=$2 version=$3 inner=$4
  local dir="$cache/$name-$version"
  if [[ ! -x "$dir/$inner" ]]; then
    local tmp
    tmp=$(mktemp -d "$cache/.partial-$name.XXXXXX")
    if (cd "$tmp" && npm pack --silent --ignore-scripts "$package@$version" >/dev/null 2>&1 \
        && tar -xzf ./*.tgz --strip-components=1 && rm -f ./*.tgz && chmod +x "./$inner"); then
      rm -rf "$dir"
      mv "$tmp" "$dir"
    else
      rm -rf "$tmp"
      echo "sdk-ts: $package@$version is not available from the npm registry" >&2
      return 0
    fi
  fi
  echo "$name $dir/$inner"
}

[[ "$(uname -sm)" == "Linux x86_64" ]] || { echo "sdk-ts: only linux x86_64 is mapped" >&2; exit 0; }
mkdir -p "$cache"
fetch bun @oven/bun-linux-x64-baseline "$BUN_VERSION" bin/bun
fetch deno @deno/linux-x64-glibc "$DENO_VERSION" deno
