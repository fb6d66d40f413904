#!/usr/bin/env bash
# Installs what vk-sandbox's build, demo and tests need on a fresh Debian
# machine with Rust and Go: Rust components, a few Debian packages (among
# them containerd, runc and the CNI plugins of the tests' real node), the
# Go-built local control plane, the real node's kubelet and the upstream
# agent-sandbox release of e2e/agent-sandbox-version (fetched from the Go
# module proxy; all cached in .cache/, stamp-checked). Every step is skipped when
# already done, so a warm machine passes in seconds; `make test` and
# `make demo` run it first.
#
#   e2e/deps.sh [all|test|demo]
#     all (make deps), test (make test): everything below
#     demo (make demo): the demo's share: no clippy/musl/Debian test tools
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=e2e/lib/progress.sh
source "$here/lib/progress.sh"

profile=${1:-all}
case "$profile" in
  all | test | demo) ;;
  *) echo "usage: e2e/deps.sh [all|test|demo]" >&2; exit 2 ;;
esac

die() { echo "deps: error: $*" >&2; exit 1; }

if [[ "$profile" == demo ]]; then progress_start deps 5; else progress_start deps 8; fi
done_rust="" done_debian="" done_plane="" done_agent="" done_kubelet="" done_metrics="" done_cyclonus="" done_chart=""

progress_step "Rust toolchain and components"
command -v cargo >/dev/null 2>&1 ||
  die "cargo is not installed: install Rust (https://rustup.rs), then retry"
if command -v rustup >/dev/null 2>&1; then
  components=(rustfmt clippy)
  installed=$(rustup component list --installed 2>/dev/null || true)
  missing=()
  for c in "${components[@]}"; do
    grep -q "^$c" <<<"$installed" || missing+=("$c")
  done
  if ((${#missing[@]})); then
    progress_note "adding Rust components: ${missing[*]}"
    rustup component add "${missing[@]}"
    done_rust+="added ${missing[*]}; "
  fi
  # The static binary `make test` checks (e2e/check-packaging.sh) and the
  # Dockerfile ships.
  if [[ "$profile" != demo ]] && ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
    progress_note "adding the Rust target x86_64-unknown-linux-musl"
    rustup target add x86_64-unknown-linux-musl
    done_rust+="added the musl target; "
  fi
elif [[ "$profile" != demo ]]; then
  for tool in rustfmt cargo-clippy; do
    command -v "$tool" >/dev/null 2>&1 ||
      die "$tool is missing and rustup is not installed to add it (install Rust with rustup)"
  done
fi
done_rust=${done_rust:-"Rust components present; "}

progress_step "Debian packages"
# command -> package. The demo needs curl and openssl (the cluster's PKI),
# python3 (the server its tour starts in a sandbox) and jq (its tour too).
declare -A pkgs=([openssl]=openssl [curl]=curl [python3]=python3 [jq]=jq)
if [[ "$profile" != demo ]]; then
  pkgs+=(
    [promtool]=prometheus
    [systemd-analyze]=systemd
    [setpriv]=util-linux
    [shellcheck]=shellcheck
    [file]=file
    [musl-gcc]=musl-tools
    # The real node of the tests (e2e/real-node.sh): its container runtime.
    [containerd]=containerd
    [runc]=runc
  )
fi
missing=()
for cmd in "${!pkgs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkgs[$cmd]}")
done
if [[ "$profile" != demo ]]; then
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  # The chart's checks (e2e/check-chart.sh) read and write YAML with it.
  python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
  # agent-sandbox's legacy Python runtime gets a venv of its own
  # (e2e/agent-sandbox.sh python-runtime, tests/e2e_pod_network_router.rs).
  python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  # Static: the init container's image holds nothing else.
  [[ -x /bin/busybox ]] && LC_ALL=C file -b /bin/busybox 2>/dev/null | grep -q 'statically linked' ||
    missing+=(busybox-static)
fi
if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  progress_note "installing Debian packages: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 ||
      die "not root and no sudo: install ${missing[*]} as root (apt-get install ${missing[*]}), then retry"
    SUDO=sudo
  else
    SUDO=
  fi
  $SUDO apt-get update -qq ||
    die "apt-get update failed (no network to the Debian mirrors?); install ${missing[*]} by hand, then retry"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get could not install ${missing[*]}; install them by hand, then retry"
  for cmd in "${!pkgs[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 ||
      die "$cmd is still not on PATH after installing ${pkgs[$cmd]} (PATH=$PATH)"
  done
  if [[ "$profile" != demo ]]; then
    python3 -c 'import yaml' 2>/dev/null || die "python3 still cannot import yaml after installing python3-yaml"
  fi
  # Debian's containerd package starts its service where systemd runs; the
  # tests' node runs its own containerd (own socket and folders) beside it.
  done_debian="installed ${missing[*]}; "
else
  done_debian="Debian packages present; "
fi

progress_step "local Kubernetes control plane"
stamp="$("$here/cluster.sh" bin)/.built"
before=$(stat -c %Y "$stamp" 2>/dev/null || true)
"$here/controlplane/build.sh" >&2
if [[ -n "$before" && "$(stat -c %Y "$stamp" 2>/dev/null || true)" == "$before" ]]; then
  done_plane="control plane cached; "
else
  done_plane="control plane built; "
fi

if [[ "$profile" != demo ]]; then
  progress_step "the real node's kubelet"
  kubelet_stamp="$(cd "$here/.." && pwd)/.cache/kubelet-$(tr -d '[:space:]' < "$here/k8s-version")/.built"
  before=$(stat -c %Y "$kubelet_stamp" 2>/dev/null || true)
  kubelet=$("$here/node/build.sh")
  if [[ -n "$before" && "$(stat -c %Y "$kubelet_stamp" 2>/dev/null || true)" == "$before" ]]; then
    done_kubelet="kubelet cached; "
  else
    done_kubelet="kubelet built ($kubelet); "
  fi
fi

# metrics-server for `kubectl top pod`: the demo's and its test's
# (tests/e2e_streaming.rs), built here so its cold Go build shows as a step
# of its own.
progress_step "metrics-server (kubectl top)"
ms_status=0
ms=$("$here/metrics-server.sh" build) || ms_status=$?
case $ms_status in
  0) done_metrics="metrics-server: $ms; " ;;
  3) done_metrics="note: $ms; "; progress_note "$ms" ;;
  *) die "building metrics-server failed (e2e/metrics-server.sh build)" ;;
esac

# Cyclonus, the independent NetworkPolicy oracle tests/netpol_oracle.rs
# compares vk-sandbox's verdicts with (docs/networkpolicy.md); the tests
# only, not the demo.
if [[ "$profile" != demo ]]; then
  progress_step "Cyclonus (NetworkPolicy oracle)"
  cy_status=0
  cy=$("$here/cyclonus.sh" build) || cy_status=$?
  case $cy_status in
    0) done_cyclonus="cyclonus: $cy; " ;;
    3) done_cyclonus="note: $cy; "; progress_note "$cy" ;;
    *) die "building Cyclonus failed (e2e/cyclonus.sh build)" ;;
  esac
fi

# The Helm chart's tools (e2e/check-chart.sh, the chart's real-node
# install): helm, helm-unittest and kubeconform from their Go modules.
if [[ "$profile" != demo ]]; then
  progress_step "chart tools: helm, helm-unittest, kubeconform (Go modules)"
  chart_status=0
  chart_tools=$("$here/helm-tools.sh" build) || chart_status=$?
  case $chart_status in
    0) done_chart="chart tools: $("$here/helm-tools.sh" versions | awk '{print $1, $3}' | paste -sd, - | sed 's/,/, /g'); " ;;
    *) die "building the chart's tools failed: ${chart_tools:-see above} (e2e/helm-tools.sh build)" ;;
  esac
fi

agent_release=$("$here/agent-sandbox.sh" release)
progress_step "agent-sandbox $agent_release: controller, runtime and SDK driver (Go module)"
# The Sandbox controller of the tests and the demo, fetched and built by
# e2e/agent-sandbox.sh (its own progress lines below). `make test` needs it
# (VK_REQUIRE_REAL_CONTROLLER defaults to 1 there, as e2e/run-tests.sh
# does); elsewhere, where it cannot be fetched, the stand-in is noted.
if [[ "$profile" == test ]]; then
  export VK_REQUIRE_REAL_CONTROLLER="${VK_REQUIRE_REAL_CONTROLLER:-1}"
fi
agent_status=0
agent=$("$here/agent-sandbox.sh" build) || agent_status=$?
case $agent_status in
  0)
    done_agent="agent-sandbox $agent_release: $agent"
    # Its in-sandbox runtime and a driver of its Go SDK (tests/e2e_sdk.rs).
    "$here/agent-sandbox.sh" sdk >/dev/null || die "building agent-sandbox's runtime and SDK driver failed"
    if [[ "$profile" == test && "$agent_release" != pre-1.0 ]]; then
      # Its router and legacy runtime (tests/e2e_pod_network_router.rs).
      "$here/agent-sandbox.sh" router >/dev/null || die "building agent-sandbox's sandbox-router failed"
      "$here/agent-sandbox.sh" python-runtime >/dev/null ||
        die "making agent-sandbox's legacy Python runtime failed"
    fi
    ;;
  3) done_agent="note: $agent"; progress_note "$agent" ;;
  *) die "fetching or building agent-sandbox $agent_release failed (e2e/agent-sandbox.sh build)" ;;
esac
progress_summary "ok ($profile): ${done_rust}${done_debian}${done_plane}${done_kubelet}${done_metrics}${done_cyclonus}${done_chart}${done_agent}"
