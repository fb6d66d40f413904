#!/usr/bin/env bash
# Cyclonus (github.com/mattfenwick/cyclonus), built from its Go module: the
# independent oracle tests/netpol_oracle.rs asks for NetworkPolicy verdicts
# (docs/networkpolicy.md#the-cyclonus-check). It runs with no cluster: it
# reads policy YAML files and a traffic JSON file.
#
#   e2e/cyclonus.sh build   build it (or reuse the cached build) and print
#                           the binary's path; exit 3 with the reason when it
#                           cannot be built here
#   e2e/cyclonus.sh which   the binary's path if it is built, else exit 3
#
# The binary is cached in .cache/cyclonus-<version>/, like the control
# plane, so a warm run does not rebuild. `go install module@version` fetches
# the module through Go's module proxy; nothing else is downloaded.
#
# Environment (optional):
#   VK_CYCLONUS_VERSION   module version (default v0.5.6)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version="${VK_CYCLONUS_VERSION:-v0.5.6}"
module=github.com/mattfenwick/cyclonus
out="$root/.cache/cyclonus-$version"
bin="$out/cyclonus"
UNAVAILABLE=3

log() { echo "cyclonus: $*" >&2; }

unavailable() {
  echo "cyclonus $version cannot be built here: $1"
  exit "$UNAVAILABLE"
}

built() { [[ -x "$bin" && "$(cat "$out/.built" 2>/dev/null)" == "$version" ]]; }

cmd_build() {
  if built; then
    echo "$bin"
    return 0
  fi
  command -v go >/dev/null 2>&1 || unavailable "Go is not installed (install Go, then retry)"
  mkdir -p "$out"
  local t0=$SECONDS
  log "building $module/cmd/cyclonus@$version into $out (about a minute cold; log $out/build.log)"
  # GOBIN: `go install` writes nowhere else; run from a scratch folder so
  # no go.mod or go.work of the caller's applies.
  local scratch
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' RETURN
  if ! (cd "$scratch" && GOBIN="$out" go install "$module/cmd/cyclonus@$version") >"$out/build.log" 2>&1; then
    tail -n 20 "$out/build.log" >&2
    unavailable "go install of $module/cmd/cyclonus@$version failed (log $out/build.log)"
  fi
  [[ -x "$bin" ]] || unavailable "go install succeeded but left no $bin (log $out/build.log)"
  echo "$version" >"$out/.built"
  log "built in $((SECONDS - t0))s: $bin"
  echo "$bin"
}

case "${1:-}" in
  build) cmd_build ;;
  which)
    built || unavailable "not built (run e2e/cyclonus.sh build, or make deps)"
    echo "$bin"
    ;;
  *)
    echo "usage: $0 build|which" >&2
    exit 2
    ;;
esac
