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

# The Sandbox controller the e2e tests, the reliability suite and the
# packaging check run: the upstream agent-sandbox controller, built here
# (cached) so that a build failure stops the run up front; the stand-in
# only where its source is absent (never with VK_REQUIRE_REAL_CONTROLLER=1).
controller_status=0
controller=$("$here/agent-sandbox.sh" which) || controller_status=$?
case $controller_status in
  0) echo "tests: Sandbox controller: $controller" ;;
  3) echo "tests: Sandbox controller: $controller" ;;
  *) echo "tests: error: cannot build the upstream agent-sandbox controller (e2e/agent-sandbox.sh which)" >&2; exit 1 ;;
esac

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
  cargo test --workspace --no-fail-fast || status=$?
  # Manifests (server-side dry-run), systemd unit, static binary as UID
  # 65532, shell scripts.
  "$here/check-packaging.sh" || status=$?
fi
echo "tests: Sandbox controller was: $controller"
if (( status != 0 )) && [[ -n "${VK_CLUSTER_LOGS:-}" ]]; then
  echo "tests: failed; control plane logs follow (full logs in $VK_CLUSTER_LOGS)"
  "$here/cluster.sh" logs || true
fi
exit $status
