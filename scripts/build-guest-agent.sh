#!/usr/bin/env bash
# Builds the guest agent binary (guest-agent/, ADR 0038) and prints its path. Std-only Rust,
# one rustc call, no cargo and no crates: Debian 12's rustc (1.63) builds it as well as a
# newer toolchain. Static glibc (+crt-static), so the guest needs no library of its own.
#
# Cached outside the repo by a hash of everything that goes into it (sources, flags, the
# compiler's version), like the other image parts:
#   ${PANDASTACK_AGENT_CACHE:-~/.cache/pandastack/guest-agent}/<hash>/pandastack-agent
# Each source change is a new <hash>: after a build only the KEEP newest (by mtime; a cache hit
# touches its entry) stay, the one just built always among them.
#
# A wheel carries this script and guest-agent/src/*.rs in the same layout under
# <prefix>/share/pandastack/ (pyproject.toml), so an installed server builds it the same way.
set -euo pipefail

KEEP=3
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
  touch "$cache/$key" 2>/dev/null || true
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.tmp-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$rustc" "${flags[@]}" "$src/src/main.rs" -o "$tmp/pandastack-agent" >&2
mkdir -p "$cache/$key"
mv "$tmp/pandastack-agent" "$out"
touch "$cache/$key"
# Entries are 16 hex digits (the .tmp-* of a build in progress are not); newest first.
find "$cache" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' \
    -printf '%T@ %f\n' | LC_ALL=C sort -rn | cut -d' ' -f2 | { grep -vx "$key" || true; } |
  tail -n +"$KEEP" |
  while read -r old; do rm -rf "${cache:?}/$old"; done
echo "$out"
