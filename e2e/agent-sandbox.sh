#!/usr/bin/env bash
# The upstream Sandbox controller, kubernetes-sigs/agent-sandbox (the one the
# README's installation section asks users to install), for the e2e tests,
# the reliability suite, the benchmarks and `make demo`.
#
#   e2e/agent-sandbox.sh build       build it with Go (or reuse the cached
#                                    build) and print the binary's path
#   e2e/agent-sandbox.sh which       print which Sandbox controller runs here:
#                                    "upstream ..." (exit 0) or "stand-in ..."
#                                    and why (exit 3)
#   e2e/agent-sandbox.sh crds KUBECONFIG
#                                    apply its four CRDs server-side and wait
#                                    until they are Established
#   e2e/agent-sandbox.sh sdk         build (or reuse) agent-sandbox's in-sandbox
#                                    runtime (packages/sandboxd) and the Go SDK
#                                    driver of e2e/sdk-driver (the upstream Go
#                                    SDK in port-forward mode); print both
#                                    paths, one a line
#   e2e/agent-sandbox.sh run KUBECONFIG [FLAG...]
#                                    `crds`, then run the controller in the
#                                    foreground (exec), out of cluster, with
#                                    the extensions (SandboxTemplate,
#                                    SandboxWarmPool, SandboxClaim)
#
# The source is not part of this repository: it is the upstream tree
# reduced to what the controller binary compiles (`src/`, Go module
# sigs.k8s.io/agent-sandbox, which the Go module proxy does not serve; its
# dependencies come from the proxy) and its CRDs (`crds/`, conversion `None`
# for use out of cluster), in shared/agent-sandbox next to the checkout.
# The binary is cached in .cache/agent-sandbox-<hash of src/>/, so a warm
# run does not rebuild; the source folder is only read.
#
# Where the source is absent, `build` and `which` say so and exit 3; the
# tests and the demo then fall back to the stand-in in e2e/sandbox-controller
# and say that they do.
#
# Environment (all optional):
#   VK_AGENT_SANDBOX_SRC        the folder holding src/ and crds/ (default
#                               shared/agent-sandbox next to the checkout)
#   VK_REQUIRE_REAL_CONTROLLER  1: a missing source or a failed build is an
#                               error, never a fall back to the stand-in (CI)
#   VK_SANDBOX_CONTROLLER       stand-in: use the stand-in although the
#                               source is there
#   VK_AGENT_SANDBOX_PROBE_ADDR health probe address of `run`
#                               (default 127.0.0.1:0, i.e. any free port)
#   VK_K8S_BIN_DIR              where kubectl is (default: e2e/cluster.sh bin)
#
# `run` uses leader election (Lease kube-system/a3317529.agent-sandbox.x-k8s.io,
# released on SIGTERM), so several processes on one cluster (two test
# binaries, the demo and a test run) never reconcile at the same time.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
src_root="${VK_AGENT_SANDBOX_SRC:-$root/../shared/agent-sandbox}"
src="$src_root/src"
crds="$src_root/crds"
require="${VK_REQUIRE_REAL_CONTROLLER:-0}"
# Exit status meaning "use the stand-in".
STAND_IN=3
LEASE_NAMESPACE=kube-system

log() { echo "agent-sandbox: $*" >&2; }
die() { echo "agent-sandbox: error: $*" >&2; exit 1; }

# stand_in WHY: fall back (exit 3), unless the real controller is required.
stand_in() {
  if [[ "$require" == 1 ]]; then
    die "$1; VK_REQUIRE_REAL_CONTROLLER=1 forbids falling back to the stand-in (e2e/sandbox-controller)"
  fi
  echo "stand-in e2e/sandbox-controller (NOT the upstream agent-sandbox controller): $1"
  exit "$STAND_IN"
}

# Why the stand-in must be used, or nothing when upstream can be.
stand_in_reason() {
  if [[ "${VK_SANDBOX_CONTROLLER:-}" == stand-in ]]; then
    echo "VK_SANDBOX_CONTROLLER=stand-in asks for it"
  elif [[ ! -f "$src/go.mod" || ! -d "$src/cmd/agent-sandbox-controller" ]]; then
    echo "the upstream source is absent: no $src/go.mod (set VK_AGENT_SANDBOX_SRC to a folder holding src/ and crds/)"
  elif [[ ! -d "$crds" ]] || ! compgen -G "$crds/*.yaml" >/dev/null; then
    echo "the upstream CRDs are absent: no $crds/*.yaml"
  fi
}

# The hash the cached binary is keyed by: every file of src/ (names and
# contents) and the Go version.
source_hash() {
  (
    cd "$src"
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    go version
  ) | sha256sum | cut -c1-16
}

# Falls back to the stand-in (exit 3) when upstream cannot be built here.
need_upstream() {
  local why
  why=$(stand_in_reason)
  [[ -z "$why" ]] || stand_in "$why"
  if ! command -v go >/dev/null 2>&1; then
    stand_in "Go is not installed (install Go, or Debian's golang package, to build the upstream controller)"
  fi
}

# Builds (or reuses) the binary; prints its path.
cmd_build() {
  need_upstream
  local hash out bin
  hash=$(source_hash)
  out="$root/.cache/agent-sandbox-$hash"
  bin="$out/agent-sandbox-controller"
  if [[ -x "$bin" && -f "$out/.built" ]]; then
    echo "$bin"
    return 0
  fi
  mkdir -p "$out"
  local t0=$SECONDS
  log "building the upstream controller from $src into $out (a few minutes cold on 2 cores)"
  if ! (cd "$src" && CGO_ENABLED=0 go build -o "$bin.tmp" ./cmd/agent-sandbox-controller) >&2; then
    rm -f "$bin.tmp"
    if [[ "$require" == 1 ]]; then
      die "go build of $src failed (see above)"
    fi
    die "go build of $src failed (see above); VK_SANDBOX_CONTROLLER=stand-in runs the tests with the stand-in instead"
  fi
  mv "$bin.tmp" "$bin"
  echo "$hash" >"$out/.built"
  log "built in $((SECONDS - t0))s: $bin"
  echo "$bin"
}

# The runtime and the SDK driver, cached by the hash of src/ and of
# e2e/sdk-driver. The driver is its own module; a copy of it gets a
# `replace` of sigs.k8s.io/agent-sandbox by the source folder, its go.sum
# filled from the Go module proxy.
cmd_sdk() {
  need_upstream
  local hash out runtime driver
  hash=$( (source_hash; cd "$here/sdk-driver" && sha256sum go.mod main.go) | sha256sum | cut -c1-16)
  out="$root/.cache/agent-sandbox-sdk-$hash"
  runtime="$out/sandboxd-runtime"
  driver="$out/sdk-driver"
  if [[ -x "$runtime" && -x "$driver" && -f "$out/.built" ]]; then
    printf '%s\n%s\n' "$runtime" "$driver"
    return 0
  fi
  mkdir -p "$out"
  local t0=$SECONDS work
  log "building agent-sandbox's runtime and the SDK driver into $out (minutes cold)"
  (cd "$src" && CGO_ENABLED=0 go build -o "$runtime.tmp" ./packages/sandboxd/cmd/sandboxd) >&2 \
    || die "go build of the runtime (packages/sandboxd) failed (see above)"
  work=$(mktemp -d)
  cp "$here/sdk-driver/go.mod" "$here/sdk-driver/main.go" "$work/"
  (
    cd "$work"
    go mod edit -replace "sigs.k8s.io/agent-sandbox=$(realpath "$src")"
    go mod tidy >&2
    CGO_ENABLED=0 go build -o "$driver.tmp" .
  ) >&2 || { rm -rf "$work"; die "go build of the SDK driver failed (see above)"; }
  rm -rf "$work"
  mv "$runtime.tmp" "$runtime"
  mv "$driver.tmp" "$driver"
  echo "$hash" >"$out/.built"
  log "built in $((SECONDS - t0))s"
  printf '%s\n%s\n' "$runtime" "$driver"
}

cmd_which() {
  need_upstream
  local bin
  bin=$(cmd_build)
  echo "upstream kubernetes-sigs/agent-sandbox controller (built from $(realpath "$src"), binary $bin)"
}

kubectl_bin() {
  local dir=${VK_K8S_BIN_DIR:-$("$here/cluster.sh" bin)}
  [[ -x "$dir/kubectl" ]] || die "no kubectl in $dir (run make deps)"
  echo "$dir/kubectl"
}

cmd_crds() {
  local kubeconfig=${1:-}
  [[ -n "$kubeconfig" && -r "$kubeconfig" ]] || die "usage: agent-sandbox.sh crds KUBECONFIG (a readable kubeconfig)"
  need_upstream
  local k
  k=$(kubectl_bin)
  # Two of them are ~400 KB: too large for client-side apply's annotation.
  "$k" --kubeconfig "$kubeconfig" apply --server-side --force-conflicts \
    --field-manager=vk-sandbox-tests -f "$crds" >/dev/null \
    || die "applying the CRDs of $crds failed"
  "$k" --kubeconfig "$kubeconfig" wait --for=condition=Established --timeout=60s -f "$crds" >/dev/null \
    || die "the CRDs of $crds are not Established after 60s"
  log "CRDs of $crds applied and Established"
}

cmd_run() {
  local kubeconfig=${1:-}
  [[ -n "$kubeconfig" ]] || die "usage: agent-sandbox.sh run KUBECONFIG [FLAG...]"
  shift
  need_upstream
  local bin
  bin=$(cmd_build)
  # Started before its CRDs are Established, it exits with
  # `no matches for kind "SandboxWarmPool"`.
  cmd_crds "$kubeconfig"
  log "running $bin (leader election in $LEASE_NAMESPACE)"
  exec "$bin" --kubeconfig="$kubeconfig" \
    --leader-elect=true --leader-election-namespace="$LEASE_NAMESPACE" \
    --enable-webhook=false --extensions \
    --metrics-bind-address=0 \
    --health-probe-bind-address="${VK_AGENT_SANDBOX_PROBE_ADDR:-127.0.0.1:0}" \
    "$@"
}

case "${1:-}" in
  build) cmd_build ;;
  which) cmd_which ;;
  crds) shift; cmd_crds "$@" ;;
  sdk) cmd_sdk ;;
  run) shift; cmd_run "$@" ;;
  *) sed -n '2,51p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
