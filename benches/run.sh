#!/usr/bin/env bash
# `make bench`: the claims-store Criterion benchmark (short configuration),
# then the cluster benchmarks (benches/cluster.rs) on the local control
# plane, with a dedicated audit apiserver for counting vk-sandbox's
# requests. Prints one table and writes it into docs/benchmarks.md.
#
#   BENCH_SCALE=k   multiply Pod counts and repetitions (default 1)
#   BENCH_DOC=-     do not write docs/benchmarks.md
#   BENCH_ONLY=...  claim,memory,startup,load,fleet,stream,lifecycle,podnet,kubelet: only those parts (no doc)
#   BENCH_BURSTS=500  only these burst sizes (no sandboxd-delay bursts)
#   BENCH_FLEET=1,50,200  the fleet sizes (vk-sandbox processes on one apiserver)
#   BENCH_FLEET_PODS=10   the fleet's Sandboxes per node (2000 at 200 nodes)
#   BENCH_VK_BIN=F  measure binary F instead of the static musl release
#                   build made here (the binary `make build`/`make dist` and
#                   the image ship; memory depends on its allocator)
#
# Both benchmarks are built once (release) and their executables run
# directly, so edits landing in the tree meanwhile do not trigger rebuilds
# between the steps.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=e2e/lib/progress.sh
source "$root/e2e/lib/progress.sh"
cargo=${CARGO:-cargo}
logs="$root/target/bench-logs"
mkdir -p "$logs" "$root/target/bench-claims"
command -v jq >/dev/null || { echo "bench: jq is needed (apt-get install jq)" >&2; exit 1; }

steps=4
[[ -z "${BENCH_VK_BIN:-}" ]] && steps=5
progress_start bench "$steps"
progress_step "building the benchmarks (release; log $logs/build.log)"
progress_heartbeat "still building the benchmarks (tail -f $logs/build.log)"
"$cargo" bench --no-run --bench claims_commit --bench cluster --message-format json \
  2>"$logs/build.log" >"$logs/build.json" ||
  { tail -n 40 "$logs/build.log" >&2; exit 1; }
exe() {
  jq -r --arg n "$1" 'select(.reason == "compiler-artifact" and .target.name == $n and .executable != null) | .executable' \
    "$logs/build.json" | tail -n 1
}
claims_commit=$(exe claims_commit)
cluster=$(exe cluster)
[[ -x "$claims_commit" && -x "$cluster" ]] || { echo "bench: benchmark executables not found in $logs/build.json" >&2; exit 1; }

if [[ -z "${BENCH_VK_BIN:-}" ]]; then
  case "$(uname -m)" in
    x86_64) musl=x86_64-unknown-linux-musl ;;
    aarch64) musl=aarch64-unknown-linux-musl ;;
    *) echo "bench: no musl target for $(uname -m); set BENCH_VK_BIN" >&2; exit 1 ;;
  esac
  progress_step "building the static musl release binary (what is shipped; log $logs/musl.log)"
  progress_heartbeat "still building the musl binary (tail -f $logs/musl.log)"
  ./e2e/musl-build.sh "$musl" "$root/target/bench-bin/vk-sandbox" >"$logs/musl.log" 2>&1 ||
    { tail -n 40 "$logs/musl.log" >&2; exit 1; }
  export BENCH_VK_BIN="$root/target/bench-bin/vk-sandbox"
fi

progress_heartbeat_stop
progress_step "claims store commits (Criterion; log $logs/claims_commit.log)"
# Only this run's figures go into the table.
rm -rf "$root/target/criterion/claims_commit"
CLAIMS_BENCH_DIR="$root/target/bench-claims" "$claims_commit" --bench >"$logs/claims_commit.log" 2>&1 ||
  { tail -n 40 "$logs/claims_commit.log" >&2; exit 1; }

progress_step "local control plane, audit apiserver and the Sandbox controller"
# The Sandbox controller of the apiserver-load lifecycles (built here, cached).
controller_status=0
controller=$(./e2e/agent-sandbox.sh which) || controller_status=$?
case $controller_status in
  0|3) echo "bench: Sandbox controller: $controller" >&2 ;;
  *) echo "bench: cannot build the upstream agent-sandbox controller (e2e/agent-sandbox.sh which)" >&2; exit 1 ;;
esac

kubeconfig="${VK_TEST_KUBECONFIG:-$(./e2e/cluster.sh up)}"
audit=$(./e2e/cluster.sh audit-apiserver up)
trap './e2e/cluster.sh audit-apiserver down >/dev/null 2>&1 || true' EXIT

progress_step "cluster benchmarks (their steps below, the table at the end)"
VK_TEST_KUBECONFIG="$kubeconfig" BENCH_AUDIT="$audit" "$cluster" --bench
if [[ "${BENCH_DOC:-}" == "-" || -n "${BENCH_ONLY:-}" ]]; then
  progress_summary "done: the table above (not written into docs/benchmarks.md)"
else
  progress_summary "done: the table above, written into docs/benchmarks.md"
fi
