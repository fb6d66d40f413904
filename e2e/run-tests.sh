#!/usr/bin/env bash
# Runs the test suite: unit tests, then integration and end-to-end tests on
# the local control plane (started here unless already up, and stopped again
# if this script started it). With KUBECONFIG set and --e2e-only, the e2e
# suite runs against that cluster instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

e2e_only=false
reliability=false
case "${1:-}" in
  --e2e-only) e2e_only=true ;;
  # `make reliability`: the full reliability suite only (issue 8).
  --reliability) reliability=true ;;
  "") ;;
  *) echo "usage: e2e/run-tests.sh [--e2e-only|--reliability]" >&2; exit 2 ;;
esac

started=false
cleanup() {
  if $started && [[ -z "${VK_KEEP_CLUSTER:-}" ]]; then "$here/cluster.sh" down || true; fi
}
trap cleanup EXIT

if [[ -n "${VK_TEST_KUBECONFIG:-}" ]]; then
  echo "tests: using the cluster of VK_TEST_KUBECONFIG=$VK_TEST_KUBECONFIG"
else
  if ! "$here/cluster.sh" status 2>/dev/null | grep -q 'apiserver: ready'; then started=true; fi
  VK_TEST_KUBECONFIG=$("$here/cluster.sh" up)
  export VK_TEST_KUBECONFIG
  export VK_CLUSTER_LOGS="${VK_CLUSTER_DIR:-$root/.cache/cluster}/logs"
  # The plane is ours: the reliability suite may restart its components.
  export VK_CLUSTER_CONTROL="$here/cluster.sh"
fi
export VK_REQUIRE_CLUSTER=1
export VK_K8S_BIN_DIR="${VK_K8S_BIN_DIR:-$("$here/cluster.sh" bin)}"

status=0
if $reliability; then
  VK_RELIABILITY="${VK_RELIABILITY:-full}" cargo test --test reliability || status=$?
  # Scenario 7, bad input: every fuzz target for a bounded time
  # (VK_SKIP_FUZZ=1 skips; the first sanitizer build is long).
  if [[ -z "${VK_SKIP_FUZZ:-}" ]]; then
    "$here/fuzz.sh" "${FUZZ_SECONDS:-60}" || status=$?
  fi
elif $e2e_only; then
  cargo test --workspace --test 'e2e_*' -- --test-threads 4 || status=$?
else
  # Least privilege: remember where vk-sandbox's audit log stands, run the
  # suite, then check every verb manifests/rbac.yaml grants was used.
  audit_log=""
  audit_from=0
  if [[ -n "${VK_CLUSTER_CONTROL:-}" ]]; then
    audit_log=$("$here/cluster.sh" vk-audit-log)
    [[ -f "$audit_log" ]] && audit_from=$(stat -c %s "$audit_log")
  fi
  cargo test --workspace --no-fail-fast || status=$?
  if [[ -n "$audit_log" && -f "$audit_log" ]]; then
    echo "tests: RBAC usage check against $audit_log (from byte $audit_from)"
    VK_RBAC_AUDIT_LOG="$audit_log" VK_RBAC_AUDIT_FROM="$audit_from" \
      cargo test --test rbac_usage -- every_granted_verb_was_used || status=$?
  elif [[ -n "$audit_log" ]]; then
    echo "tests: RBAC usage check skipped: the control plane writes no audit log of" \
      "vk-sandbox (it was started by an older e2e/cluster.sh; restart it: make cluster-down)"
  fi
  # Manifests (server-side dry-run), systemd unit, static binary as UID
  # 65532, shell scripts.
  "$here/check-packaging.sh" || status=$?
fi
if (( status != 0 )) && [[ -n "${VK_CLUSTER_LOGS:-}" ]]; then
  echo "tests: failed; control plane logs follow (full logs in $VK_CLUSTER_LOGS)"
  "$here/cluster.sh" logs || true
fi
exit $status
