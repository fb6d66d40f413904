#!/usr/bin/env bash
# The upstream Sandbox controller, kubernetes-sigs/agent-sandbox (the one the
# README's installation section asks users to install), for the e2e tests,
# the reliability suite, the benchmarks and `make demo`.
#
#   e2e/agent-sandbox.sh build       fetch and build it (or reuse the cached
#                                    build) and print the binary's path
#   e2e/agent-sandbox.sh which       print which Sandbox controller runs here:
#                                    "upstream ..." (exit 0) or "stand-in ..."
#                                    and why (exit 3)
#   e2e/agent-sandbox.sh release     print the release the tests run
#                                    ("v1.0.3", or "pre-1.0"); builds nothing
#   e2e/agent-sandbox.sh crds KUBECONFIG
#                                    apply its four CRDs server-side and wait
#                                    until they are Established
#   e2e/agent-sandbox.sh sdk         build (or reuse) agent-sandbox's in-sandbox
#                                    runtime (packages/sandboxd) and the Go SDK
#                                    driver of e2e/sdk-driver (the upstream Go
#                                    SDK in port-forward mode); print both
#                                    paths, one a line
#   e2e/agent-sandbox.sh router      build (or reuse) agent-sandbox's Go
#                                    sandbox-router and print its path
#   e2e/agent-sandbox.sh python-runtime
#                                    make (or reuse) a Python environment for
#                                    the release's legacy runtime (its
#                                    examples/python-runtime-sandbox: the API
#                                    the SDK speaks through the router) and
#                                    print a launcher: `LAUNCHER PORT DIR`
#   e2e/agent-sandbox.sh run KUBECONFIG [FLAG...]
#                                    `crds`, then run the controller in the
#                                    foreground (exec), out of cluster, with
#                                    the extensions (SandboxTemplate,
#                                    SandboxWarmPool, SandboxClaim)
#
# The release is the Go module sigs.k8s.io/agent-sandbox at the version
# pinned in e2e/agent-sandbox-version, fetched by the Go toolchain from the
# module proxy (checksum-verified) into Go's module cache; the controller,
# the runtime and the router are built from it with the module's own go.mod
# and go.sum, the CRDs are its k8s/crds. Builds and a copy of the CRDs are
# cached in .cache/agent-sandbox-<version>/, so a warm run neither fetches
# nor builds. No code of it is in this repository.
#
# VK_AGENT_SANDBOX=pre-1.0 runs the older tree instead: kubernetes-sigs/
# agent-sandbox at commit 2fd412d (before 1.0: it still serves v1alpha1 and
# has a conversion webhook, started with --enable-webhook=false), which
# the module proxy does not serve; its source (`src/`, reduced to what the
# binaries compile) and CRDs (`crds/`, conversion `None`) are read from
# VK_AGENT_SANDBOX_SRC, by default shared/agent-sandbox next to the
# checkout, and cached in .cache/agent-sandbox-pre-1.0-<hash of src/>/.
#
# Where Go is missing, the module cannot be fetched (no network to the
# module proxy) or, for pre-1.0, its source is absent, `build` and `which`
# say so and exit 3; the tests and the demo then fall back to the stand-in
# in e2e/sandbox-controller and say that they do. A failed build is an
# error.
#
# Environment (all optional):
#   VK_AGENT_SANDBOX            the release: a module version (default: the
#                               one in e2e/agent-sandbox-version) or pre-1.0
#   VK_AGENT_SANDBOX_SRC        pre-1.0 only: the folder holding src/ and
#                               crds/ (default shared/agent-sandbox next to
#                               the checkout)
#   VK_REQUIRE_REAL_CONTROLLER  1: anything that would fall back to the
#                               stand-in is an error instead (CI, make test)
#   VK_SANDBOX_CONTROLLER       stand-in: use the stand-in although upstream
#                               could run
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
# shellcheck source=e2e/lib/progress.sh
source "$here/lib/progress.sh"
module=sigs.k8s.io/agent-sandbox
pinned=$(tr -d '[:space:]' <"$here/agent-sandbox-version")
release="${VK_AGENT_SANDBOX:-$pinned}"
src_root="${VK_AGENT_SANDBOX_SRC:-$root/../shared/agent-sandbox}"
require="${VK_REQUIRE_REAL_CONTROLLER:-0}"
# Exit status meaning "use the stand-in".
STAND_IN=3
LEASE_NAMESPACE=kube-system
# Bumped when the way a module release is built changes, so older builds in
# .cache/ are rebuilt.
RECIPE=2

log() { echo "agent-sandbox: $*" >&2; }
die() { echo "agent-sandbox: error: $*" >&2; exit 1; }

case "$release" in
  pre-1.0) ;;
  v[0-9]*.[0-9]*.[0-9]*) ;;
  *) die "VK_AGENT_SANDBOX=$release: expected a module version such as $pinned, or pre-1.0" ;;
esac
pre10() { [[ "$release" == pre-1.0 ]]; }

# stand_in WHY: fall back (exit 3), unless the real controller is required.
stand_in() {
  if [[ "$require" == 1 ]]; then
    die "$1; VK_REQUIRE_REAL_CONTROLLER=1 forbids falling back to the stand-in (e2e/sandbox-controller)"
  fi
  echo "stand-in e2e/sandbox-controller (NOT the upstream agent-sandbox controller): $1"
  exit "$STAND_IN"
}

# Falls back to the stand-in (exit 3) when upstream cannot run here, before
# anything is fetched or built.
need_upstream() {
  if [[ "${VK_SANDBOX_CONTROLLER:-}" == stand-in ]]; then
    stand_in "VK_SANDBOX_CONTROLLER=stand-in asks for it"
  fi
  if pre10; then
    [[ -f "$src_root/src/go.mod" && -d "$src_root/src/cmd/agent-sandbox-controller" ]] ||
      stand_in "the pre-1.0 source is absent: no $src_root/src/go.mod (set VK_AGENT_SANDBOX_SRC to a folder holding src/ and crds/, or unset VK_AGENT_SANDBOX for $pinned)"
    compgen -G "$src_root/crds/*.yaml" >/dev/null ||
      stand_in "the pre-1.0 CRDs are absent: no $src_root/crds/*.yaml"
  fi
  command -v go >/dev/null 2>&1 ||
    stand_in "Go is not installed (install Go, or Debian's golang package, to build agent-sandbox $release)"
}

# The cache folder of the selected release (known without fetching).
out_dir() {
  if pre10; then
    local hash
    hash=$(
      cd "$src_root/src"
      find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
      go version
    ) && hash=$(sha256sum <<<"$hash" | cut -c1-16)
    echo "$root/.cache/agent-sandbox-pre-1.0-$hash"
  else
    echo "$root/.cache/agent-sandbox-$release"
  fi
}

# Sets src_dir (the module's root) and crds_dir for the selected release,
# fetching a module release through the Go module proxy; falls back to the
# stand-in when it cannot be fetched. Writes $out/source (what was built).
fetch() {
  if pre10; then
    src_dir="$src_root/src"
    crds_dir="$src_root/crds"
    mkdir -p "$out"
    progress_step "the pre-1.0 source: $(realpath "$src_dir")"
    echo "pre-1.0 tree $(realpath "$src_dir") (kubernetes-sigs/agent-sandbox commit 2fd412d)" >"$out/source"
    return 0
  fi
  local json t0=$SECONDS
  progress_step "fetching $module@$release (Go module proxy, checksum database)"
  # Outside any module, so that only the release itself is resolved.
  if ! json=$(cd / && go mod download -json "$module@$release" 2>&1); then
    local why
    why=$(sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' <<<"$json" | head -n1 | sed 's/\\n\\t/ /g')
    stand_in "cannot fetch $module@$release: ${why:-$json}"
  fi
  src_dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json")
  commit=$(sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)",\{0,1\}$/\1/p' <<<"$json" | head -n1)
  local info
  info=$(sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p' <<<"$json")
  released=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)
  [[ -n "$src_dir" && -f "$src_dir/go.mod" ]] || die "go mod download $module@$release named no module folder: $json"
  crds_dir="$src_dir/k8s/crds"
  compgen -G "$crds_dir/*.yaml" >/dev/null || die "$module@$release has no CRDs in k8s/crds"
  mkdir -p "$out"
  echo "Go module $module@$release (commit ${commit:0:12})" >"$out/source"
  progress_note "fetched in $((SECONDS - t0))s: $src_dir"
}

# go_build NAME PACKAGE: builds PACKAGE of the fetched source into $out/NAME
# (static, the release's version stamped as its own release build does).
go_build() {
  local name=$1 pkg=$2 t0=$SECONDS ldflags=""
  if ! pre10; then
    local v="$module/internal/version"
    ldflags="-X $v.gitVersion=$release -X $v.gitSHA=${commit:0:7} -X $v.buildDate=${released:-unknown}"
  fi
  progress_step "building $name ($pkg)"
  progress_heartbeat "still building $name"
  if ! (cd "$src_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg") >&2; then
    progress_heartbeat_stop
    rm -f "$out/$name.tmp"
    die "go build of $pkg ($(cat "$out/source")) failed (see above)"
  fi
  progress_heartbeat_stop
  mv "$out/$name.tmp" "$out/$name"
  progress_note "built in $((SECONDS - t0))s: $out/$name"
}

# The stamp of a build of NAME from the selected release.
stamp_of() { echo "recipe $RECIPE, $release, $1${2:+, $2}"; }
is_built() { [[ -x "$out/$1" && "$(cat "$out/.built-$1" 2>/dev/null)" == "$(stamp_of "$1" "${2:-}")" ]]; }
mark_built() { stamp_of "$1" "${2:-}" >"$out/.built-$1"; }

# ensure NAME PACKAGE...: pairs of names and packages, built unless cached
# (a module release fetched only when something is to be built).
ensure() {
  local missing=() i
  for ((i = 1; i <= $#; i += 2)); do
    is_built "${!i}" || missing+=("$i")
  done
  ((${#missing[@]})) || return 0
  progress_start "agent-sandbox $release" $((${#missing[@]} + 1))
  fetch
  for i in "${missing[@]}"; do
    local j=$((i + 1))
    go_build "${!i}" "${!j}"
    mark_built "${!i}"
  done
  # The CRDs with the binaries, so `crds` reads no module cache.
  rm -rf "$out/crds"
  mkdir -p "$out/crds"
  cp "$crds_dir"/*.yaml "$out/crds/"
  progress_summary "ready in $out"
}

# Builds (or reuses) the controller into $out (not in a subshell, so that
# a fall back to the stand-in prints its reason and exits 3).
build_controller() {
  need_upstream
  out=$(out_dir)
  ensure agent-sandbox-controller ./cmd/agent-sandbox-controller
}

cmd_build() {
  build_controller
  echo "$out/agent-sandbox-controller"
}

# The runtime and the SDK driver. The driver is a module of its own
# (e2e/sdk-driver): a copy of it gets a requirement on the release (for
# pre-1.0 a `replace` by the source folder), its go.sum filled through the
# module proxy; it is rebuilt when e2e/sdk-driver changes.
cmd_sdk() {
  need_upstream
  out=$(out_dir)
  ensure sandboxd-runtime ./packages/sandboxd/cmd/sandboxd
  local driver_sum
  driver_sum=$(cd "$here/sdk-driver" && sha256sum go.mod main.go | sha256sum | cut -c1-16)
  if ! is_built sdk-driver "$driver_sum"; then
    if ! pre10; then
      grep -q "$module $pinned" "$here/sdk-driver/go.mod" ||
        die "e2e/agent-sandbox-version says $pinned but e2e/sdk-driver/go.mod requires another $module"
    fi
    progress_start "agent-sandbox $release" 2
    fetch
    progress_step "building the SDK driver (e2e/sdk-driver against $(cat "$out/source"))"
    local work t0=$SECONDS
    work=$(mktemp -d)
    cp "$here/sdk-driver/go.mod" "$here/sdk-driver/main.go" "$work/"
    if ! (
      cd "$work"
      if pre10; then
        go mod edit -require "$module@v0.0.0" -replace "$module=$(realpath "$src_dir")"
      else
        go mod edit -require "$module@$release"
      fi
      go mod tidy
      CGO_ENABLED=0 go build -trimpath -o "$out/sdk-driver.tmp" .
    ) >&2; then
      rm -rf "$work" "$out/sdk-driver.tmp"
      die "go build of the SDK driver failed (see above)"
    fi
    rm -rf "$work"
    mv "$out/sdk-driver.tmp" "$out/sdk-driver"
    mark_built sdk-driver "$driver_sum"
    progress_summary "SDK driver built in $((SECONDS - t0))s"
  fi
  printf '%s\n%s\n' "$out/sandboxd-runtime" "$out/sdk-driver"
}

cmd_router() {
  need_upstream
  pre10 && die "the pre-1.0 tree holds no sandbox-router (it is reduced to the controller, the SDK and the runtime)"
  out=$(out_dir)
  ensure sandbox-router ./sandbox-router/cmd
  echo "$out/sandbox-router"
}

# The legacy Python runtime: its main.py from the release, and a venv with
# the server packages its requirements pin (FastAPI, uvicorn,
# python-multipart; not the ML packages its agent tasks use), installed from
# the Python package index. The launcher serves main.py on 127.0.0.1:PORT
# with SANDBOX_BASE_DIR=DIR.
cmd_python_runtime() {
  need_upstream
  pre10 && die "the pre-1.0 tree holds no python runtime example"
  out=$(out_dir)
  local dir="$out/python-runtime" stamp
  stamp="fastapi==0.138.0 uvicorn==0.49.0 python-multipart==0.0.32, $(python3 --version 2>&1)"
  if [[ ! -x "$dir/launch" || "$(cat "$dir/.built" 2>/dev/null)" != "$stamp" ]]; then
    command -v python3 >/dev/null || die "python3 is needed for the legacy runtime (apt-get install python3 python3-venv)"
    progress_start "agent-sandbox $release" 2
    fetch
    progress_step "a Python environment for the legacy runtime (FastAPI, uvicorn)"
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 -m venv "$dir/venv" >&2 || die "python3 -m venv failed (apt-get install python3-venv)"
    # shellcheck disable=SC2086
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check ${stamp%%,*} >&2 ||
      die "pip install of the legacy runtime's server packages failed (see above)"
    cp "$src_dir/examples/python-runtime-sandbox/main.py" "$dir/main.py"
    cat >"$dir/launch" <<LAUNCH
#!/usr/bin/env bash
# agent-sandbox $release's legacy runtime on 127.0.0.1:\$1, files under \$2.
cd "$dir" && SANDBOX_BASE_DIR="\$2" exec "$dir/venv/bin/python" -m uvicorn main:app --host 127.0.0.1 --port "\$1" --log-level warning
LAUNCH
    chmod +x "$dir/launch"
    echo "$stamp" >"$dir/.built"
    progress_summary "legacy runtime ready in $dir"
  fi
  echo "$dir/launch"
}

cmd_which() {
  build_controller
  echo "upstream kubernetes-sigs/agent-sandbox $release (built from the $(cat "$out/source"), binary $out/agent-sandbox-controller)"
}

kubectl_bin() {
  local dir=${VK_K8S_BIN_DIR:-$("$here/cluster.sh" bin)}
  [[ -x "$dir/kubectl" ]] || die "no kubectl in $dir (run make deps)"
  echo "$dir/kubectl"
}

cmd_crds() {
  local kubeconfig=${1:-}
  [[ -n "$kubeconfig" && -r "$kubeconfig" ]] || die "usage: agent-sandbox.sh crds KUBECONFIG (a readable kubeconfig)"
  local crds k
  build_controller
  if pre10; then crds="$src_root/crds"; else crds="$out/crds"; fi
  k=$(kubectl_bin)
  # Two of them are ~200 KB: too large for client-side apply's annotation.
  # Server-side apply with one field manager also takes back what another
  # release's CRDs had (pre-1.0's v1alpha1).
  "$k" --kubeconfig "$kubeconfig" apply --server-side --force-conflicts \
    --field-manager=vk-sandbox-tests -f "$crds" >/dev/null \
    || die "applying the CRDs of $crds failed"
  "$k" --kubeconfig "$kubeconfig" wait --for=condition=Established --timeout=60s -f "$crds" >/dev/null \
    || die "the CRDs of $crds are not Established after 60s"
  log "CRDs of agent-sandbox $release ($crds) applied and Established"
}

cmd_run() {
  local kubeconfig=${1:-}
  [[ -n "$kubeconfig" ]] || die "usage: agent-sandbox.sh run KUBECONFIG [FLAG...]"
  shift
  local flags=()
  build_controller
  local bin="$out/agent-sandbox-controller"
  # Started before its CRDs are Established, it exits with
  # `no matches for kind "SandboxWarmPool"`.
  cmd_crds "$kubeconfig"
  # 1.0 has no webhook (v1alpha1 and its conversion are gone); pre-1.0
  # would start one, which out of cluster has no Service to be reached by.
  pre10 && flags+=(--enable-webhook=false)
  log "running agent-sandbox $release: $bin (leader election in $LEASE_NAMESPACE)"
  exec "$bin" --kubeconfig="$kubeconfig" \
    --leader-elect=true --leader-election-namespace="$LEASE_NAMESPACE" \
    --extensions \
    --metrics-bind-address=0 \
    --health-probe-bind-address="${VK_AGENT_SANDBOX_PROBE_ADDR:-127.0.0.1:0}" \
    "${flags[@]}" "$@"
}

case "${1:-}" in
  build) cmd_build ;;
  which) cmd_which ;;
  release) echo "$release" ;;
  crds) shift; cmd_crds "$@" ;;
  sdk) cmd_sdk ;;
  router) cmd_router ;;
  python-runtime) cmd_python_runtime ;;
  run) shift; cmd_run "$@" ;;
  *) sed -n '2,73p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
