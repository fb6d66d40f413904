#!/usr/bin/env bash
# metrics-server (sigs.k8s.io/metrics-server), built from its Go module, for
# `kubectl top pod`: the demo's (e2e/demo.sh) and its end-to-end test
# (tests/e2e_streaming.rs).
#
#   e2e/metrics-server.sh build   build it (or reuse the cached build) and
#                                 print the binary's path; exit 3 with the
#                                 reason when it cannot be built here
#
# The binary is cached in .cache/metrics-server-<version>/, like the control
# plane, so a warm run does not rebuild. The module is fetched through Go's
# module proxy into a scratch module (`go get -tool`, as the module's own
# replace-free build needs); nothing else is downloaded.
#
# Environment (optional):
#   VK_METRICS_SERVER_VERSION   module version (default v0.8.0)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version="${VK_METRICS_SERVER_VERSION:-v0.8.0}"
module=sigs.k8s.io/metrics-server
UNAVAILABLE=3

log() { echo "metrics-server: $*" >&2; }

unavailable() {
  echo "metrics-server $version cannot be built here: $1"
  exit "$UNAVAILABLE"
}

cmd_build() {
  local out="$root/.cache/metrics-server-$version"
  local bin="$out/metrics-server"
  if [[ -x "$bin" && -f "$out/.built" ]]; then
    echo "$bin"
    return 0
  fi
  command -v go >/dev/null 2>&1 || unavailable "Go is not installed"
  mkdir -p "$out"
  local scratch t0=$SECONDS
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' RETURN
  log "building $module@$version into $out (a few minutes cold on 2 cores; log $out/build.log)"
  if ! (
    cd "$scratch" &&
      go mod init local/metrics-server-build &&
      go get -tool "$module/cmd/metrics-server@$version" &&
      go build -o "$bin.tmp" "$module/cmd/metrics-server"
  ) >"$out/build.log" 2>&1; then
    rm -f "$bin.tmp"
    tail -n 20 "$out/build.log" >&2
    unavailable "go build of $module@$version failed (log $out/build.log)"
  fi
  mv "$bin.tmp" "$bin"
  echo "$version" >"$out/.built"
  log "built in $((SECONDS - t0))s: $bin"
  echo "$bin"
}

case "${1:-}" in
  build) cmd_build ;;
  *)
    echo "usage: $0 build" >&2
    exit 2
    ;;
esac
