#!/usr/bin/env bash
# The chart's tools, built from their Go modules (the chart's offline checks,
# e2e/check-chart.sh, and its real-node install run them):
#
#   helm           helm.sh/helm/v4            (cmd/helm)
#   helm-unittest  github.com/helm-unittest/helm-unittest (cmd/helm-unittest,
#                  run standalone: `helm-unittest CHART`, no plugin install)
#   kubeconform    github.com/yannh/kubeconform (cmd/kubeconform)
#
#   e2e/helm-tools.sh build [TOOL...]  build them (or reuse the cached
#                                      builds) and print each binary's path,
#                                      one a line, in the order asked
#                                      (default: all three); exit 3 with the
#                                      reason when one cannot be built here
#   e2e/helm-tools.sh which TOOL       the binary's path if it is built,
#                                      else exit 3
#   e2e/helm-tools.sh versions         "tool module version", one a line
#
# Each binary is cached in .cache/<tool>-<version>/ (stamped with its
# version), like the control plane: a warm run builds nothing. `go mod
# download module@version` fetches the module through Go's module proxy,
# checksum-verified, and `go build` builds it with its own go.mod; nothing
# else is downloaded.
#
# Environment (optional): VK_HELM_VERSION (default v4.3.2),
# VK_HELM_UNITTEST_VERSION (v1.1.2), VK_KUBECONFORM_VERSION (v0.8.0).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
UNAVAILABLE=3

log() { echo "helm-tools: $*" >&2; }

# tool -> "module package version ldflags"
spec() {
  case "$1" in
    helm)
      local v=${VK_HELM_VERSION:-v4.3.2}
      # As helm's own release build stamps it (`helm version`).
      echo "helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm $v -X helm.sh/helm/v4/internal/version.version=$v"
      ;;
    helm-unittest)
      echo "github.com/helm-unittest/helm-unittest github.com/helm-unittest/helm-unittest/cmd/helm-unittest ${VK_HELM_UNITTEST_VERSION:-v1.1.2}"
      ;;
    kubeconform)
      echo "github.com/yannh/kubeconform github.com/yannh/kubeconform/cmd/kubeconform ${VK_KUBECONFORM_VERSION:-v0.8.0}"
      ;;
    *) echo "helm-tools: unknown tool '$1' (helm, helm-unittest, kubeconform)" >&2; exit 2 ;;
  esac
}

unavailable() {
  echo "$1"
  exit "$UNAVAILABLE"
}

# Sets module pkg version ldflags out bin for TOOL.
load() {
  local s
  s=$(spec "$1")
  read -r module pkg version ldflags <<<"$s"
  out="$root/.cache/$1-$version"
  bin="$out/$1"
}

built() { [[ -x "$bin" && "$(cat "$out/.built" 2>/dev/null)" == "$version" ]]; }

build_one() {
  local tool=$1
  load "$tool"
  if built; then
    echo "$bin"
    return 0
  fi
  command -v go >/dev/null 2>&1 ||
    unavailable "$tool $version cannot be built here: Go is not installed (install Go, then retry)"
  mkdir -p "$out"
  local t0=$SECONDS json dir pkgdir
  log "building $pkg@$version into $out (a minute or more cold; log $out/build.log)"
  # The module's own folder (fetched through the module proxy, checksum-
  # verified), built with its own go.mod and go.sum: `go install mod@v`
  # refuses modules with replace directives (helm-unittest has one).
  if ! json=$(cd / && go mod download -json "$module@$version" 2>&1); then
    echo "$json" >"$out/build.log"
    unavailable "$tool $version cannot be built here: go mod download $module@$version failed: $(grep -m1 '"Error"' <<<"$json" || tail -1 <<<"$json")"
  fi
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json")
  [[ -n "$dir" && -f "$dir/go.mod" ]] || unavailable "$tool $version cannot be built here: go mod download named no module folder"
  pkgdir=./${pkg#"$module"/}
  if ! (cd "$dir" && CGO_ENABLED=0 go build -trimpath ${ldflags:+-ldflags "$ldflags"} -o "$bin.tmp" "$pkgdir") >"$out/build.log" 2>&1; then
    rm -f "$bin.tmp"
    tail -n 20 "$out/build.log" >&2
    unavailable "$tool $version cannot be built here: go build of $pkg@$version failed (log $out/build.log)"
  fi
  mv "$bin.tmp" "$bin"
  [[ -x "$bin" ]] || unavailable "$tool $version cannot be built here: go install succeeded but left no $bin (log $out/build.log)"
  echo "$version" >"$out/.built"
  log "built $tool $version in $((SECONDS - t0))s: $bin"
  echo "$bin"
}

tools_or_all() {
  if (($#)); then printf '%s\n' "$@"; else printf '%s\n' helm helm-unittest kubeconform; fi
}

case "${1:-}" in
  build)
    shift
    for t in $(tools_or_all "$@"); do build_one "$t"; done
    ;;
  which)
    [[ -n "${2:-}" ]] || { echo "usage: $0 which TOOL" >&2; exit 2; }
    load "$2"
    built || unavailable "$2 $version is not built (run e2e/helm-tools.sh build, or make deps)"
    echo "$bin"
    ;;
  versions)
    for t in $(tools_or_all); do
      load "$t"
      echo "$t $module $version"
    done
    ;;
  *)
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
