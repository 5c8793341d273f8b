#!/usr/bin/env bash
# Installs the Debian packages the host runtime needs. Idempotent and quiet when all are present,
# so `make test` and `make run` can call it every time.
set -euo pipefail

packages=(
  qemu-system-x86 qemu-utils
  mmdebstrap
  busybox-static cpio
  e2fsprogs xfsprogs
  iproute2 nftables
  # `systemd-analyze verify` of the units (deploy/systemd/; PID 1 need not be systemd) and
  # setpriv, which the units' tests run their command lines under (tests/cli/test_units*.py).
  systemd util-linux
  python3-venv
  ca-certificates
  # The S3 server of the tests and the development cluster (scripts/s3-server): OpenStack
  # Swift's servers, with its s3api middleware; they run only when that script starts them.
  swift-proxy swift-account swift-container swift-object
  # The store's tests and the development cluster run a private PostgreSQL from its binaries
  # (scripts/pg-cluster); a single-machine install needs none (SQLite).
  postgresql
  # The dashboard's browser tests (tests/server/browser.py): Debian's Chromium, driven by
  # Playwright's Python package over its own protocol; no browser download.
  chromium
  # OCI images (host/images/oci/, ADR 0046): the tests run Debian's registry on loopback and push
  # the images they make with skopeo, its basic auth from an htpasswd file (apache2-utils).
  docker-registry skopeo apache2-utils
  # tests/guest/test_watch_scan.py stops an agent at one system call to make a race happen.
  strace
  # tests/e2e/test_tls_serve.py puts nginx in front of serve (HTTP/2 to E2B's SDKs, as the
  # TLS guide's example, docs/tls.md); it runs only when a test starts it with its own config.
  nginx
  # tests/e2e/test_tls_caddy.py runs the guide's Caddyfile (docs/tls.md, "Caddy in front"):
  # bookworm's caddy 2.6.2, started by the test alone, on loopback (caddy.service is masked
  # below before the package can start it on :80).
  caddy
)

missing=()
for pkg in "${packages[@]}"; do
  [[ "$pkg" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

# The TypeScript SDK's build (sdk-ts/scripts/build.sh): Debian 12's nodejs (18) and npm. Checked
# by command, not by package: a nodejs from elsewhere (NodeSource's bundles npm) is as good.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

# The guest agent binary (scripts/build-guest-agent.sh): any rustc will do (a rustup one in
# ~/.cargo/bin too); without one, Debian's, with the static glibc it links.
if ! command -v rustc >/dev/null && [[ ! -x "$HOME/.cargo/bin/rustc" ]]; then
  missing+=(rustc libc6-dev)
fi

if ((${#missing[@]})); then
  if [[ $EUID -ne 0 ]]; then
    echo "host-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "host-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # The package enables and starts caddy.service, serving its default Caddyfile on :80 of
  # every interface; a test host must not. Masked before it is installed (a unit file of
  # the admin's own there is left alone), it neither starts now nor at boot (its postinst
  # then says its preset failed: harmless). `systemctl unmask caddy` to serve with it.
  if [[ " ${missing[*]} " == *" caddy "* ]] && [[ ! -e /etc/systemd/system/caddy.service ]]; then
    mkdir -p /etc/systemd/system
    ln -s /dev/null /etc/systemd/system/caddy.service
  fi
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
