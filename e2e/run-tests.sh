#!/usr/bin/env bash
# Runs the test suite: unit tests, then integration and end-to-end tests on
# the local control plane (started here unless already up, and stopped again
# if this script started it). With KUBECONFIG set and --e2e-only, the e2e
# suite runs against that cluster instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
# shellcheck source=e2e/lib/progress.sh
source "$here/lib/progress.sh"

e2e_only=false
reliability=false
case "${1:-}" in
  --e2e-only) e2e_only=true ;;
  # `make reliability`: the full reliability suite only (docs/reliability.md).
  --reliability) reliability=true ;;
  "") ;;
  *) echo "usage: e2e/run-tests.sh [--e2e-only|--reliability]" >&2; exit 2 ;;
esac

if $reliability; then
  name=reliability steps=2
  [[ -z "${VK_SKIP_FUZZ:-}" ]] && steps=3
elif $e2e_only; then
  name=e2e steps=2
else
  name=tests steps=5
fi
progress_start "$name" "$steps"

started=false
cleanup() {
  if $started && [[ -z "${VK_KEEP_CLUSTER:-}" ]]; then "$here/cluster.sh" down || true; fi
}
trap cleanup EXIT

if [[ -n "${VK_TEST_KUBECONFIG:-}" ]]; then
  progress_step "using the cluster of VK_TEST_KUBECONFIG=$VK_TEST_KUBECONFIG"
else
  progress_step "local control plane (e2e/cluster.sh up)"
  if ! "$here/cluster.sh" status 2>/dev/null | grep -q 'apiserver: ready'; then started=true; fi
  VK_TEST_KUBECONFIG=$("$here/cluster.sh" up)
  export VK_TEST_KUBECONFIG
  export VK_CLUSTER_LOGS="${VK_CLUSTER_DIR:-$root/.cache/cluster}/logs"
  # The plane is ours: the reliability suite may restart its components.
  export VK_CLUSTER_CONTROL="$here/cluster.sh"
fi
export VK_REQUIRE_CLUSTER=1
export VK_K8S_BIN_DIR="${VK_K8S_BIN_DIR:-$("$here/cluster.sh" bin)}"

# The Sandbox controller the e2e tests, the reliability suite and the
# packaging check run: the upstream agent-sandbox controller at the release
# of e2e/agent-sandbox-version, fetched and built here (cached) so that a
# failure stops the run up front. Never the stand-in: a test that needs
# upstream fails rather than passing by skipping. VK_REQUIRE_REAL_CONTROLLER=0
# allows the stand-in (no Go, no network to the module proxy), and the
# skips that come with it.
export VK_REQUIRE_REAL_CONTROLLER="${VK_REQUIRE_REAL_CONTROLLER:-1}"
controller_status=0
controller=$("$here/agent-sandbox.sh" which) || controller_status=$?
case $controller_status in
  0) echo "tests: Sandbox controller: $controller" ;;
  3) echo "tests: Sandbox controller: $controller" ;;
  *) echo "tests: error: cannot build the upstream agent-sandbox controller (e2e/agent-sandbox.sh which)" >&2; exit 1 ;;
esac

status=0
failed=()
real_node_test=on_a_real_node
if $reliability; then
  progress_step "reliability suite (${VK_RELIABILITY:-full}; its scenarios and runs below)"
  VK_RELIABILITY="${VK_RELIABILITY:-full}" cargo test --test reliability || { status=$?; failed+=("reliability suite"); }
  # Scenario 7, bad input: every fuzz target for a bounded time
  # (VK_SKIP_FUZZ=1 skips; the first sanitizer build is long).
  if [[ -z "${VK_SKIP_FUZZ:-}" ]]; then
    progress_step "fuzzing every target for ${FUZZ_SECONDS:-60}s (e2e/fuzz.sh)"
    "$here/fuzz.sh" "${FUZZ_SECONDS:-60}" || { status=$?; failed+=(fuzzing); }
  fi
elif $e2e_only; then
  progress_step "end-to-end tests"
  cargo test --workspace --test 'e2e_*' -- --test-threads 4 || { status=$?; failed+=("e2e tests"); }
else
  # Least privilege: remember where vk-sandbox's audit log stands, run the
  # suite, then check every verb manifests/rbac.yaml grants was used.
  audit_log=""
  audit_from=0
  if [[ -n "${VK_CLUSTER_CONTROL:-}" ]]; then
    audit_log=$("$here/cluster.sh" vk-audit-log)
    [[ -f "$audit_log" ]] && audit_from=$(stat -c %s "$audit_log")
  fi
  progress_step "unit, integration and end-to-end tests (cargo test --workspace)"
  cargo test --workspace --no-fail-fast -- --skip "$real_node_test" || { status=$?; failed+=("cargo test"); }
  # The installation on a real node (e2e/real-node.sh), alone and with its
  # progress shown: which node ran it, each step, the teardown's report.
  progress_step "the real node: the DaemonSet, the Helm chart, sandbox addresses from containers (tests/e2e_real_node*.rs)"
  # One real node per machine (its kubelet's ports, containerd, the host's
  # CNI): where several checkouts share a machine, the lock file
  # VK_REAL_NODE_LOCK serialises this step across them, if it exists.
  real_node_lock=${VK_REAL_NODE_LOCK:-/work/helpers/real-node.lock}
  locked=()
  if [[ -e "$real_node_lock" ]] && command -v flock >/dev/null 2>&1; then
    echo "tests: waiting for the real-node lock $real_node_lock"
    locked=(flock "$real_node_lock")
  fi
  # Its image's binary: the static one the packaging check uses too.
  static_bin=${VK_STATIC_BIN:-$root/target/check-packaging/vk-sandbox-static}
  if VK_MUSL_PROFILE=dev "$here/musl-build.sh" x86_64-unknown-linux-musl "$static_bin" >/dev/null; then
    # The manifests (e2e_real_node), then the Helm chart with agent-sandbox's
    # own chart (e2e_real_node_helm), then sandbox Pod addresses from the
    # node's containers (e2e_real_node_pod_network), one after the other.
    VK_STATIC_BIN=$static_bin "${locked[@]}" cargo test --test e2e_real_node --test e2e_real_node_helm --test e2e_real_node_pod_network -- --nocapture --test-threads 1 ||
      { status=$?; failed+=("real node"); }
  else
    status=1; failed+=("real node (static build)")
  fi
  if [[ -n "$audit_log" && -f "$audit_log" ]]; then
    echo "tests: RBAC usage check against $audit_log (from byte $audit_from)"
    VK_RBAC_AUDIT_LOG="$audit_log" VK_RBAC_AUDIT_FROM="$audit_from" \
      cargo test --test rbac_usage -- every_granted_verb_was_used \
      || { status=$?; failed+=("RBAC usage check"); }
  elif [[ -n "$audit_log" ]]; then
    echo "tests: RBAC usage check skipped: the control plane writes no audit log of" \
      "vk-sandbox (it was started by an older e2e/cluster.sh; restart it: make cluster-down)"
  fi
  # Manifests (server-side dry-run), systemd unit, static binary as UID
  # 65532, shell scripts, image, and the Helm chart's offline checks.
  progress_step "packaging checks (e2e/check-packaging.sh)"
  "$here/check-packaging.sh" || { status=$?; failed+=("packaging checks"); }
  # The older supported release: the lifecycle and the warm-pool path once
  # more on agent-sandbox before 1.0 (v1alpha1 still served), where its
  # source tree is present (e2e/agent-sandbox.sh, VK_AGENT_SANDBOX=pre-1.0).
  progress_step "lifecycle and warm pools on agent-sandbox pre-1.0"
  pre10_status=0
  pre10=$(VK_AGENT_SANDBOX=pre-1.0 VK_REQUIRE_REAL_CONTROLLER=0 "$here/agent-sandbox.sh" which) || pre10_status=$?
  case $pre10_status in
    0)
      echo "tests: $pre10"
      VK_AGENT_SANDBOX=pre-1.0 cargo test --test e2e_lifecycle --test e2e_warm_pool ||
        { status=$?; failed+=("pre-1.0 lifecycle and warm pools"); }
      ;;
    3) echo "tests: note: the pre-1.0 tier skipped: ${pre10#*: }" ;;
    *) status=1; failed+=("pre-1.0 build (e2e/agent-sandbox.sh which)") ;;
  esac
fi
echo "tests: Sandbox controller was: $controller"
if (( status != 0 )) && [[ -n "${VK_CLUSTER_LOGS:-}" ]]; then
  echo "tests: failed; control plane logs follow (full logs in $VK_CLUSTER_LOGS)"
  "$here/cluster.sh" logs || true
fi
if ((status == 0)); then
  progress_summary "passed (${steps} steps)"
else
  progress_summary "FAILED: ${failed[*]} (the output above says which)"
fi
exit $status
