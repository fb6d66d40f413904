#!/usr/bin/env bash
# Static release build for one musl target: musl-build.sh TARGET OUT
#   x86_64-unknown-linux-musl   C parts (ring) with musl-gcc (Debian musl-tools)
#   aarch64-unknown-linux-musl  C parts and the link with Debian's
#                               gcc-aarch64-linux-gnu (+ libc6-dev-arm64-cross
#                               headers); libc and the C runtime
#                               objects come from Rust's self-contained musl
# Missing Rust targets and Debian packages are installed on demand.
set -euo pipefail
target=${1:?usage: musl-build.sh TARGET OUT}; out=${2:?usage: musl-build.sh TARGET OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

die() { echo "musl-build: error: $*" >&2; exit 1; }
apt_install() {
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  echo "musl-build: installing Debian packages: $*"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || die "could not install $* (install it by hand)"
}

command -v rustup >/dev/null || die "rustup not found (the musl target is added with rustup)"
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
command -v file >/dev/null || apt_install file
rustflags="${RUSTFLAGS:-} -C target-feature=+crt-static"
case "$target" in
  x86_64-unknown-linux-musl)
    command -v musl-gcc >/dev/null || apt_install musl-tools
    export CC_x86_64_unknown_linux_musl=musl-gcc
    want='x86-64'
    ;;
  aarch64-unknown-linux-musl)
    # ring's C needs the cross C headers too (libc6-dev-arm64-cross, only
    # a recommendation of the compiler package).
    if ! command -v aarch64-linux-gnu-gcc >/dev/null || [[ ! -e /usr/aarch64-linux-gnu/include/stdint.h ]]; then
      apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    fi
    export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
    # The glibc cross toolchain links; musl's libc.a and crt objects are
    # Rust's own (never glibc's).
    rustflags+=" -C link-self-contained=yes"
    want='ARM aarch64'
    ;;
  *) die "unsupported target $target (x86_64-unknown-linux-musl or aarch64-unknown-linux-musl)" ;;
esac
# VK_MUSL_PROFILE=dev: the same static linkage without release LTO (the
# packaging check uses it; release archives never do).
profile=${VK_MUSL_PROFILE:-release}
case "$profile" in
  release) outdir=release ;;
  dev) outdir=debug ;;
  *) die "VK_MUSL_PROFILE must be release or dev, got '$profile'" ;;
esac
# VK_MUSL_FEATURES=mimalloc: that allocator instead of musl's (benchmarks).
features=()
[[ -n "${VK_MUSL_FEATURES:-}" ]] && features=(--features "$VK_MUSL_FEATURES")
# VK_MUSL_LOCKED=1: Cargo.lock as committed (the Dockerfile's build).
[[ -n "${VK_MUSL_LOCKED:-}" ]] && features+=(--locked)
RUSTFLAGS="$rustflags" cargo build --profile "$profile" --target "$target" --bin vk-sandbox "${features[@]}"
mkdir -p "$(dirname "$out")"
cp "${CARGO_TARGET_DIR:-target}/$target/$outdir/vk-sandbox" "$out"
desc=$(file -b "$out")
[[ "$desc" == *"$want"* ]] || die "$out is not a $want binary: $desc"
if [[ "$desc" == *"dynamically linked"* ]]; then
  die "$out is dynamically linked: $desc"
fi
echo "built $out ($(echo "$desc" | cut -d, -f1-2))"
