#!/usr/bin/env bash
# Installs what vk-sandbox's build and tests need on a fresh Debian machine:
# Rust components, a few Debian packages, the Go-built local control plane
# and the upstream agent-sandbox controller (both cached in .cache/, so a
# warm machine skips them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || rustup component add rustfmt clippy
  # The static binary `make test` checks (e2e/check-packaging.sh) and the
  # Dockerfile ships.
  rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl
fi

# Debian packages: command -> package.
declare -A pkgs=(
  [openssl]=openssl
  [curl]=curl
  [promtool]=prometheus
  [systemd-analyze]=systemd
  [setpriv]=util-linux
  [shellcheck]=shellcheck
  [file]=file
  [musl-gcc]=musl-tools
)
missing=()
for cmd in "${!pkgs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkgs[$cmd]}")
done
if ((${#missing[@]})); then
  echo "deps: installing Debian packages: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$here/controlplane/build.sh"
# The Sandbox controller of the tests and the demo. Its source is not in
# this repository (see e2e/agent-sandbox.sh); where it is absent the tests
# fall back to the stand-in, unless VK_REQUIRE_REAL_CONTROLLER=1 (CI).
agent_status=0
agent=$("$here/agent-sandbox.sh" build) || agent_status=$?
case $agent_status in
  0) echo "deps: upstream agent-sandbox controller: $agent" ;;
  3) echo "deps: note: $agent" ;;
  *) echo "deps: error: building the upstream agent-sandbox controller failed" >&2; exit 1 ;;
esac
echo "deps: ok"
