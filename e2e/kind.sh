#!/usr/bin/env bash
# vk-sandbox on a kind cluster, installed the in-cluster way
# (`make kind-e2e` runs `e2e/kind.sh` = up + smoke + test):
#
#   e2e/kind.sh up      kind cluster (1 control plane + 1 worker), both images
#                       built and loaded, CRDs, namespace, RBAC, the sandboxd
#                       token Secret, the simulator DaemonSet and
#                       manifests/daemonset.yaml; waits for the virtual node
#                       <worker>-sandboxd to be Ready
#   e2e/kind.sh smoke   the upstream agent-sandbox controller on the host
#                       (e2e/agent-sandbox.sh run, kind kubeconfig; the
#                       stand-in, namespace kind-smoke only, where it
#                       cannot be fetched) and manifests/examples/sandbox.yaml:
#                       the Pod must run on the virtual node with the
#                       simulator's VM address
#   e2e/kind.sh test    e2e/run-tests.sh --e2e-only with VK_TEST_KUBECONFIG
#                       set to the kind cluster's kubeconfig
#   e2e/kind.sh down    delete the kind cluster
#   e2e/kind.sh         up, smoke, test (the cluster is kept; `down` removes it)
#
# UNTESTED: this script has never run. The machines it was written on have
# no Docker daemon and cannot pull images (rust, distroless, busybox, the
# kind node image), so only `bash -n` and shellcheck have checked it. What
# it installs is checked elsewhere: every manifest passes server-side
# dry-run and the static binary's UID 65532 behaviour is tested by
# e2e/check-packaging.sh on the local control plane.
#
# Known limits of `test` on kind: the e2e tests start vk-sandbox processes
# and simulators on the host (as on the local plane); they need the kind
# apiserver reachable from the host (kind's kubeconfig does that) and,
# for kubelet API tests, the apiserver reaching back to the host, which a
# kind cluster does not do by default. Such tests fail here, not in the
# DaemonSet path that `smoke` covers.
#
# Layout on the cluster: the simulator runs as a hostNetwork DaemonSet on
# the same labelled node(s) as vk-sandbox, on 127.0.0.1:7777, so
# vk-sandbox's default SANDBOXD_URL works unchanged, as with a real
# sandboxd on the host. Both read the token from the Secret sandboxd-token.
#
# Environment (all optional):
#   KIND_CLUSTER_NAME   cluster name (default vk-sandbox)
#   KIND_NODE_IMAGE     kind node image (default: kind's own default)
#   VK_IMAGE            vk-sandbox image tag (default vk-sandbox:dev, the
#                       tag manifests/daemonset.yaml uses)
#   VK_SIM_IMAGE        simulator image tag (default vk-sandboxd-sim:dev)
#   VK_KIND_DIR         state folder (default .cache/kind)
#   VK_KIND_NO_BUILD=1  use the images already built
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

cluster=${KIND_CLUSTER_NAME:-vk-sandbox}
image=${VK_IMAGE:-vk-sandbox:dev}
sim_image=${VK_SIM_IMAGE:-vk-sandboxd-sim:dev}
dir=${VK_KIND_DIR:-$root/.cache/kind}
kubeconfig=$dir/kubeconfig
ns=sandbox-system
smoke_ns=kind-smoke
node_label=sandbox.cocoonstack.io/sandboxd

say() { echo "kind-e2e: $*"; }
die() { echo "kind-e2e: error: $*" >&2; exit 1; }

need() {
  command -v "$1" >/dev/null || die "$1 not found: $2"
}

kubectl_bin() {
  if command -v kubectl >/dev/null; then
    command -v kubectl
  elif [[ -x "$("$here/cluster.sh" bin)/kubectl" ]]; then
    echo "$("$here/cluster.sh" bin)/kubectl"
  else
    die "kubectl not found (install it, or run \`make controlplane\` to build one into .cache/)"
  fi
}
k() { "$(kubectl_bin)" --kubeconfig "$kubeconfig" "$@"; }

cluster_exists() { kind get clusters 2>/dev/null | grep -qx "$cluster"; }

worker_nodes() {
  k get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' \
    | grep -v -- '-sandboxd$' || true
}

up() {
  need docker "install Docker (the images are built with docker build)"
  need kind "install kind (sigs.k8s.io/kind)"
  docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable (docker info failed)"
  mkdir -p "$dir"

  if cluster_exists; then
    say "kind cluster $cluster exists; reusing it"
  else
    say "creating kind cluster $cluster (1 control plane, 1 worker)"
    local image_flag=()
    [[ -n "${KIND_NODE_IMAGE:-}" ]] && image_flag=(--image "$KIND_NODE_IMAGE")
    kind create cluster --name "$cluster" "${image_flag[@]}" --wait 120s --config - <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
EOF
  fi
  kind get kubeconfig --name "$cluster" > "$kubeconfig"
  chmod 0600 "$kubeconfig"

  if [[ -z "${VK_KIND_NO_BUILD:-}" ]]; then
    say "building $image (Dockerfile at the repository root)"
    docker build \
      --build-arg VK_VERSION="$(git describe --tags --always --dirty 2>/dev/null || echo dev)" \
      --build-arg VK_REVISION="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
      -t "$image" .
    say "building $sim_image (e2e/sandboxd-sim/Dockerfile)"
    docker build -f e2e/sandboxd-sim/Dockerfile -t "$sim_image" .
  fi
  say "loading the images into $cluster"
  kind load docker-image --name "$cluster" "$image" "$sim_image"

  local workers
  workers=$(worker_nodes)
  [[ -n "$workers" ]] || die "no worker node in $cluster"
  local n
  for n in $workers; do k label node "$n" "$node_label=true" --overwrite >/dev/null; done
  say "sandboxd nodes: $(echo "$workers" | tr '\n' ' ')"

  say "CRDs, namespace, RBAC"
  k apply --server-side --force-conflicts -f crds/ >/dev/null
  k wait --for=condition=Established --timeout=60s -f crds/ >/dev/null
  k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
  k apply -f manifests/rbac.yaml >/dev/null

  if ! k -n "$ns" get secret sandboxd-token >/dev/null 2>&1; then
    say "creating the Secret sandboxd-token (random token)"
    k -n "$ns" create secret generic sandboxd-token \
      --from-literal=token="kind-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" >/dev/null
  fi

  say "the sandboxd simulator (hostNetwork DaemonSet on 127.0.0.1:7777)"
  k apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: sandboxd-sim
  namespace: $ns
  labels: {app.kubernetes.io/name: sandboxd-sim}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: sandboxd-sim}
  template:
    metadata:
      labels: {app.kubernetes.io/name: sandboxd-sim}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      nodeSelector: {$node_label: "true"}
      securityContext: {runAsUser: 65532, runAsGroup: 65532, runAsNonRoot: true, fsGroup: 65532}
      containers:
        - name: sandboxd-sim
          image: $sim_image
          imagePullPolicy: IfNotPresent
          args: ["--listen", "127.0.0.1:7777", "--pool", "base:24.04=4",
                 "--api-token-file", "/etc/sandboxd/token", "--advertise-addr", "10.0.0.5:7777"]
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: ["ALL"]}}
          volumeMounts:
            - {name: token, mountPath: /etc/sandboxd, readOnly: true}
      volumes:
        - name: token
          secret: {secretName: sandboxd-token, defaultMode: 0440, items: [{key: token, path: token}]}
EOF
  k -n "$ns" rollout status ds/sandboxd-sim --timeout=180s

  say "manifests/daemonset.yaml (image $image)"
  sed "s#image: vk-sandbox:dev#image: $image#" manifests/daemonset.yaml | k apply -f - >/dev/null
  k -n "$ns" rollout restart ds/vk-sandbox >/dev/null 2>&1 || true
  k -n "$ns" rollout status ds/vk-sandbox --timeout=300s \
    || { k -n "$ns" logs ds/vk-sandbox --all-containers --tail=50 || true; die "the vk-sandbox DaemonSet did not become ready"; }

  for n in $workers; do
    say "waiting for the virtual node $n-sandboxd to be Ready"
    k wait --for=condition=Ready "node/$n-sandboxd" --timeout=120s \
      || { k -n "$ns" logs ds/vk-sandbox --tail=50 || true; die "node $n-sandboxd is not Ready"; }
    k get node "$n-sandboxd" -o wide
  done
  say "up; kubeconfig: $kubeconfig"
}

smoke() {
  [[ -r "$kubeconfig" ]] || die "no kubeconfig at $kubeconfig (run \`e2e/kind.sh up\` first)"
  k create namespace "$smoke_ns" --dry-run=client -o yaml | k apply -f - >/dev/null
  local log=$dir/sandbox-controller.log which_status=0 controller
  controller=$("$here/agent-sandbox.sh" which) || which_status=$?
  case $which_status in
    0)
      say "Sandbox controller: $controller"
      VK_K8S_BIN_DIR=$(dirname "$(command -v kubectl)") \
        "$here/agent-sandbox.sh" run "$kubeconfig" >"$log" 2>&1 &
      ;;
    3)
      say "Sandbox controller: $controller"
      k apply --server-side --force-conflicts -f e2e/sandbox-controller/crds/ >/dev/null
      cargo build -p sandbox-controller --bin sandbox-controller
      "${CARGO_TARGET_DIR:-$root/target}/debug/sandbox-controller" --kubeconfig "$kubeconfig" --namespace "$smoke_ns" >"$log" 2>&1 &
      ;;
    *) die "cannot build the upstream agent-sandbox controller (e2e/agent-sandbox.sh which)" ;;
  esac
  local ctl=$!
  # shellcheck disable=SC2064  # expand now: stop this controller on exit
  trap "kill $ctl 2>/dev/null || true" EXIT

  k -n "$smoke_ns" delete sandbox demo --ignore-not-found --wait=true >/dev/null
  k -n "$smoke_ns" apply -f manifests/examples/sandbox.yaml >/dev/null
  say "waiting for the Sandbox demo's Pod to run on a virtual node"
  local phase="" node="" ip="" _
  for _ in $(seq 1 90); do
    phase=$(k -n "$smoke_ns" get pod demo -o jsonpath='{.status.phase}' 2>/dev/null || true)
    node=$(k -n "$smoke_ns" get pod demo -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)
    ip=$(k -n "$smoke_ns" get pod demo -o jsonpath='{.status.podIP}' 2>/dev/null || true)
    [[ "$phase" == Running && -n "$ip" ]] && break
    sleep 2
  done
  [[ "$phase" == Running && "$node" == *-sandboxd && -n "$ip" ]] \
    || { tail -20 "$log" >&2 || true; k -n "$smoke_ns" describe pod demo >&2 || true; die "Pod demo: phase '$phase' node '$node' ip '$ip'"; }
  say "Pod demo Running on $node with IP $ip"
  k -n "$smoke_ns" wait --for=condition=Ready sandbox/demo --timeout=60s
  k -n "$smoke_ns" delete sandbox demo --wait=true >/dev/null
  kill "$ctl" 2>/dev/null || true
  say "smoke passed"
}

run_tests() {
  [[ -r "$kubeconfig" ]] || die "no kubeconfig at $kubeconfig (run \`e2e/kind.sh up\` first)"
  local kubectl_dir
  kubectl_dir=$(dirname "$(kubectl_bin)")
  say "e2e suite against $kubeconfig"
  VK_TEST_KUBECONFIG=$kubeconfig VK_K8S_BIN_DIR=$kubectl_dir "$here/run-tests.sh" --e2e-only
}

down() {
  need kind "install kind (sigs.k8s.io/kind)"
  if cluster_exists; then
    kind delete cluster --name "$cluster"
  else
    say "no kind cluster $cluster"
  fi
}

case "${1:-all}" in
  up) up ;;
  smoke) smoke ;;
  test) run_tests ;;
  down) down ;;
  all) up; smoke; run_tests ;;
  *) die "usage: e2e/kind.sh [up|smoke|test|down]" ;;
esac
