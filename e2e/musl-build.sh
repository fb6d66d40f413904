#!/usr/bin/env bash
# Static release build for one musl target: musl-build.sh TARGET OUT
set -euo pipefail
target=${1:?target}; out=${2:?output path}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
case "$target" in
  x86_64-*)
    command -v musl-gcc >/dev/null || { echo "installing musl-tools"; apt-get update -qq && apt-get install -y -qq musl-tools >/dev/null; }
    export CC_x86_64_unknown_linux_musl=musl-gcc
    ;;
  aarch64-*)
    command -v aarch64-linux-gnu-gcc >/dev/null || { echo "installing gcc-aarch64-linux-gnu"; apt-get update -qq && apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null; }
    export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
    ;;
esac
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" cargo build --release --target "$target" --bin vk-sandbox
cp "target/$target/release/vk-sandbox" "$out"
if file "$out" | grep -qE 'dynamically linked'; then
  echo "error: $out is dynamically linked" >&2; exit 1
fi
echo "built $out ($(file -b "$out" | cut -d, -f1-2))"
