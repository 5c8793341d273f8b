#!/usr/bin/env bash
# Builds the guest agent binary (guest-agent/, ADR 0038) and prints its path. Std-only Rust,
# one rustc call, no cargo and no crates: Debian 12's rustc (1.63) builds it as well as a
# newer toolchain. Static glibc (+crt-static), so the guest needs no library of its own.
#
# Cached outside the repo by a hash of everything that goes into it (sources, flags, the
# compiler's version), like the other image parts:
#   ${PANDASTACK_AGENT_CACHE:-~/.cache/pandastack/guest-agent}/<hash>/pandastack-agent
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/guest-agent
rustc=${RUSTC:-}
if [[ -z "$rustc" ]]; then
  if command -v rustc >/dev/null; then
    rustc=rustc
  elif [[ -x "$HOME/.cargo/bin/rustc" ]]; then
    rustc=$HOME/.cargo/bin/rustc
  else
    echo "build-guest-agent: no rustc (scripts/host-deps.sh installs Debian's)" >&2
    exit 1
  fi
fi

# Paths are remapped and codegen is single-unit, so the same inputs give the same bytes.
flags=(--edition 2021 --crate-name pandastack_agent --crate-type bin
       --target x86_64-unknown-linux-gnu
       -C opt-level=2 -C codegen-units=1 -C debuginfo=0 -C strip=symbols
       -C target-feature=+crt-static -C metadata=pandastack-agent
       "--remap-path-prefix=$src=guest-agent")

key=$(
  {
    "$rustc" -vV
    printf '%s\n' "${flags[@]/$src/SRC}"
    cd "$src" && find src -type f -name '*.rs' | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -c1-16
)
cache=${PANDASTACK_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pandastack/guest-agent}
out=$cache/$key/pandastack-agent
if [[ -x "$out" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.tmp-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$rustc" "${flags[@]}" "$src/src/main.rs" -o "$tmp/pandastack-agent" >&2
mkdir -p "$cache/$key"
mv "$tmp/pandastack-agent" "$out"
echo "$out"
