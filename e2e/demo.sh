#!/usr/bin/env bash
# `make demo` / `make demo-down`: a Sandbox, a warm pool and a claim going
# Running on a vk-sandbox node, everything on this machine.
#
#   e2e/demo.sh up       build what is missing, start the local control plane,
#                        the sandboxd simulator, the upstream agent-sandbox
#                        controller (e2e/agent-sandbox.sh: the release of
#                        e2e/agent-sandbox-version; the stand-in only where
#                        it cannot be fetched), vk-sandbox and
#                        metrics-server (e2e/metrics-server.sh; `kubectl top`),
#                        then apply manifests/examples/: the Sandbox to
#                        Running / Ready, the SandboxTemplate +
#                        SandboxWarmPool to warm Pods, the SandboxClaim
#                        adopting one of them
#   e2e/demo.sh down     stop everything `up` started, then the control plane
#   e2e/demo.sh status   what runs, and where its logs are
#
# Binaries are debug builds (target/debug: shared with `make test`, so usually
# already built); VK_DEMO_PROFILE=release builds and uses release ones;
# VK_DEMO_NO_BUILD=1 uses the binaries already there.
# Everything the demo writes (PIDs, logs, tokens, kubeconfigs, state) is in
# .cache/demo/ (VK_DEMO_DIR); its kubeconfig for users (the admin's, with the
# demo's namespace as the default) is .cache/demo/kubeconfig.
# VK_DEMO_KEEP_CLUSTER=1 makes `down` leave the control plane running.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
dir="${VK_DEMO_DIR:-$root/.cache/demo}"
profile="${VK_DEMO_PROFILE:-debug}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
bindir="$target_dir/$profile"
node="demo-sandboxd"
ns="demo"
sandbox="demo"
stand_in_crd="$root/e2e/sandbox-controller/crds/agents.x-k8s.io_sandboxes.yaml"
inventory_crd="$root/crds/sandbox.cocoonstack.io_nodeinventories.yaml"
examples="$root/manifests/examples"
example="$examples/sandbox.yaml"
pool_name=sandboxd-base
claim_name=demo-claim
# Started in this order, stopped in the reverse one. The Sandbox controller
# is the upstream one (agent-sandbox-controller) or, where it cannot be
# fetched, the stand-in (sandbox-controller).
services=(sandboxd-sim agent-sandbox-controller sandbox-controller vk-sandbox metrics-server)
# metrics-server as the plane's aggregated metrics API (`kubectl top`).
metrics_api=v1beta1.metrics.k8s.io
metrics_sa=demo-metrics-server

t0=$SECONDS
say() { printf 'demo [%3ss] %s\n' "$((SECONDS - t0))" "$*"; }
die() {
  echo "demo: error: $*" >&2
  [[ "${phase:-}" == up ]] && echo "demo: whatever started keeps running for a look at $dir/*.log; make demo-down stops it" >&2
  exit 1
}

k8s_bin() { "$here/cluster.sh" bin; }
admin_kubeconfig() { "$here/cluster.sh" kubeconfig; }
kc() { "$(k8s_bin)/kubectl" --kubeconfig "$(admin_kubeconfig)" "$@"; }

pid_of() { [[ -f "$dir/$1.pid" ]] && cat "$dir/$1.pid"; }
alive() { local p; p=$(pid_of "$1") && [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }

# A TCP port nobody listens on, preferring $1.
free_port() {
  local p=$1
  for _ in $(seq 1 200); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
    p=$((p + 1))
  done
  die "no free port near $1"
}

# start NAME ARGS...: a detached process (own session), output to NAME.log.
start() {
  local name=$1; shift
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

log_tail() {
  echo "---- last lines of $dir/$1.log" >&2
  tail -n 25 "$dir/$1.log" >&2 || true
}

# wait_until WHAT SECONDS SERVICE CMD...: poll CMD every 0.5 s; fail (with the
# service's log) if the service dies or time runs out. Returns 1 on timeout
# when SOFT=1 is set, instead of failing.
wait_until() {
  local what=$1 limit=$2 svc=$3; shift 3
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if [[ -n "$svc" ]] && ! alive "$svc"; then
      log_tail "$svc"
      die "$svc exited while waiting for $what"
    fi
    if (( SECONDS - start > limit )); then
      [[ "${SOFT:-0}" == 1 ]] && return 1
      [[ -n "$svc" ]] && log_tail "$svc"
      die "$what: not after ${limit}s"
    fi
    sleep 0.5
  done
}

jp() { kc "$@" 2>/dev/null || true; }
node_ready() { [[ "$(jp get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]]; }
pod_bound() { [[ "$(jp -n "$ns" get pod "$sandbox" -o 'jsonpath={.spec.nodeName}')" == "$node" ]]; }
pod_running() { [[ "$(jp -n "$ns" get pod "$sandbox" -o 'jsonpath={.status.phase}')" == Running ]]; }
sandbox_ready() { [[ "$(jp -n "$ns" get sandbox "$sandbox" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]]; }
top_works() { kc -n "$ns" top pod "$sandbox" --no-headers >/dev/null 2>&1; }
metrics_server_live() { curl -fsSk --max-time 1 "https://127.0.0.1:$(cat "$dir/metrics-server.port")/livez"; }
sim_up() { curl -fsS --max-time 1 -H "Authorization: Bearer $(cat "$dir/sandboxd.token")" "$(cat "$dir/sandboxd.url")/v1/info"; }
ns_gone() { ! kc get namespace "$ns" >/dev/null 2>&1; }
# Pods of the warm pool's Sandboxes Running (label the pool puts on them).
pool_running() {
  local want n
  want=$(jp -n "$ns" get sandboxwarmpool "$pool_name" -o 'jsonpath={.spec.replicas}')
  n=$(jp -n "$ns" get pods -l agents.x-k8s.io/warm-pool-sandbox \
    -o 'jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}' | grep -c . || true)
  [[ -n "$want" && "$n" == "$want" ]]
}
claim_ready() { [[ "$(jp -n "$ns" get sandboxclaim "$claim_name" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" == True ]]; }
# POST /v1/claim requests sandboxd received so far (the simulator's log).
claims_made() {
  curl -fsS --max-time 2 "$(cat "$dir/sandboxd.url")/_sim/requests?path=/v1/claim&method=POST" 2>/dev/null \
    | grep -o '"seq":' | grep -c . || true
}
pod_gone() { ! kc -n "$ns" get pod "$sandbox" >/dev/null 2>&1; }
no_pods() { [[ -z "$(jp -n "$ns" get pods -o name)" ]]; }
inventory_listed() { [[ "$(jp get nodeinventories.sandbox.cocoonstack.io "$node" -o 'jsonpath={.entries[*].name}' 2>/dev/null)" == *"$sandbox"* ]]; }
crd_established() { [[ "$(jp get crd sandboxes.agents.x-k8s.io -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}')" == True ]]; }

stop_services() {
  local i svc pid
  for (( i=${#services[@]}-1; i>=0; i-- )); do
    svc=${services[$i]}
    pid=$(pid_of "$svc") || continue
    if kill -0 "$pid" 2>/dev/null; then
      say "stopping $svc (pid $pid)"
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        say "$svc did not stop within 10s; killing it"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
    rm -f "$dir/$svc.pid"
  done
}

cluster_ready() { "$here/cluster.sh" status 2>/dev/null | grep 'apiserver: ready' >/dev/null; }  # no -q: pipefail + SIGPIPE

cmd_up() {
  command -v cargo >/dev/null || die "cargo is needed (https://rustup.rs), or run make deps"
  command -v curl >/dev/null || die "curl is needed (apt-get install curl)"
  mkdir -p "$dir"
  chmod 700 "$dir"

  if alive vk-sandbox && { alive agent-sandbox-controller || alive sandbox-controller; } \
      && alive sandboxd-sim && cluster_ready; then
    say "the demo is already running (make demo-down stops it)"
    kc -n "$ns" get sandboxes,pods -o wide 2>/dev/null || true
    summary
    return 0
  fi
  stop_services

  # The Sandbox controller: upstream agent-sandbox, its Go module fetched
  # and built (cached).
  local which_status=0 controller
  say "fetching and building (or reusing) agent-sandbox $("$here/agent-sandbox.sh" release) (e2e/agent-sandbox.sh)"
  controller=$("$here/agent-sandbox.sh" which) || which_status=$?
  case $which_status in
    0) upstream=true ;;
    3) upstream=false; say "NOTE: $controller" ;;
    *) die "cannot fetch or build the upstream agent-sandbox controller (e2e/agent-sandbox.sh which)" ;;
  esac

  local flags=() bins=(vk-sandbox sandboxd-sim)
  [[ "$profile" == release ]] && flags=(--release)
  $upstream || bins+=(sandbox-controller)
  if [[ "${VK_DEMO_NO_BUILD:-0}" == 1 ]]; then
    local b
    for b in "${bins[@]}"; do
      [[ -x "$bindir/$b" ]] || die "VK_DEMO_NO_BUILD=1 but $bindir/$b is missing"
    done
    say "using the binaries in $bindir as they are (VK_DEMO_NO_BUILD=1)"
  else
    local pkgs=() b
    for b in "${bins[@]}"; do pkgs+=(-p "$b" --bin "$b"); done
    say "building ${bins[*]} ($profile; cargo rebuilds only what changed)"
    (cd "$root" && cargo build "${flags[@]}" "${pkgs[@]}") || die "cargo build failed"
  fi

  local fresh_cluster=false
  cluster_ready || fresh_cluster=true
  say "starting the local control plane (the first run builds it from source: 20-40 min)"
  "$here/cluster.sh" up >/dev/null
  if $fresh_cluster; then
    # A new cluster has no Pods: claims kept from an earlier run would only
    # be swept as dangling. Start sandboxd and vk-sandbox from empty state.
    rm -rf "$dir/vk-state" "$dir/sandboxd-sim"
  fi
  say "control plane ready: $(admin_kubeconfig)"
  # The user's kubeconfig: the admin's, the demo's namespace the default,
  # so the README's quick tour runs as written.
  (umask 077; cp "$(admin_kubeconfig)" "$dir/kubeconfig")
  "$(k8s_bin)/kubectl" --kubeconfig "$dir/kubeconfig" config set-context --current \
    --namespace "$ns" >/dev/null

  # sandboxd simulator: a root token, one warm pool, persisted claims.
  local sim_port kubelet_port admin_port
  sim_port=$(free_port 7777)
  kubelet_port=$(free_port 10260)
  admin_port=$(free_port $((kubelet_port + 1)))
  if [[ ! -s "$dir/sandboxd.token" ]]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/sandboxd.token")
  fi
  echo "http://127.0.0.1:$sim_port" >"$dir/sandboxd.url"
  mkdir -p "$dir/sandboxd-sim"
  say "starting the sandboxd simulator on 127.0.0.1:$sim_port (warm pool base:24.04=4)"
  start sandboxd-sim "$bindir/sandboxd-sim" --listen "127.0.0.1:$sim_port" \
    --pool base:24.04=4 --api-token-file "$dir/sandboxd.token" \
    --state-file "$dir/sandboxd-sim/claims.json"
  wait_until "the sandboxd simulator to answer /v1/info" 20 sandboxd-sim sim_up

  say "installing the NodeInventory CRD ($(basename "$inventory_crd"))"
  kc apply --server-side --force-conflicts -f "$inventory_crd" >/dev/null

  # Scoped to the demo namespace: tests sharing this cluster run their own.
  if [[ "$(jp get namespace "$ns" -o 'jsonpath={.status.phase}')" == Terminating ]]; then
    say "waiting for the namespace $ns of an earlier run to finish terminating"
    wait_until "namespace $ns gone" 60 "" ns_gone
  fi
  kc get namespace "$ns" >/dev/null 2>&1 || kc create namespace "$ns" >/dev/null
  if $upstream; then
    say "Sandbox controller: $controller"
    say "installing its CRDs (Sandbox, SandboxTemplate, SandboxWarmPool, SandboxClaim) and starting it (every namespace, --extensions)"
    start agent-sandbox-controller env VK_AGENT_SANDBOX_PROBE_ADDR="127.0.0.1:$(free_port 18081)" \
      "$here/agent-sandbox.sh" run "$(admin_kubeconfig)"
    wait_until "the agent-sandbox CRDs to be Established" 90 agent-sandbox-controller crd_established
  else
    say "Sandbox controller: the STAND-IN e2e/sandbox-controller, not upstream agent-sandbox (namespace $ns only; no warm pools or claims)"
    kc apply --server-side --force-conflicts -f "$stand_in_crd" >/dev/null
    wait_until "the Sandbox CRD to be Established" 30 "" crd_established
    start sandbox-controller env RUST_LOG="${RUST_LOG:-info}" "$bindir/sandbox-controller" \
      --kubeconfig "$(admin_kubeconfig)" --namespace "$ns"
  fi
  local ctl="agent-sandbox-controller"
  if ! $upstream; then ctl="sandbox-controller"; fi

  # vk-sandbox runs as the ServiceAccount of manifests/rbac.yaml.
  "$here/cluster.sh" sa-kubeconfig "$dir/vk-sandbox.kubeconfig" >/dev/null
  mkdir -p "$dir/vk-state"
  chmod 700 "$dir/vk-state"
  say "starting vk-sandbox as node $node (kubelet API 127.0.0.1:$kubelet_port, admin 127.0.0.1:$admin_port)"
  start vk-sandbox env -u KUBECONFIG RUST_LOG="${RUST_LOG:-info}" "$bindir/vk-sandbox" \
    --kubeconfig "$dir/vk-sandbox.kubeconfig" \
    --node-name "$node" --node-ip 127.0.0.1 \
    --listen-addr "127.0.0.1:$kubelet_port" --admin-addr "127.0.0.1:$admin_port" \
    --state-path "$dir/vk-state/claims.json" \
    --sandboxd-url "http://127.0.0.1:$sim_port" \
    --sandboxd-token-file "$dir/sandboxd.token" \
    --publish-inventory --publish-interval 5s --orphan-scan-interval 30s
  say "waiting for node $node to be Ready"
  wait_until "node $node Ready" 60 vk-sandbox node_ready
  say "node $node is Ready"
  alive "$ctl" || { log_tail "$ctl"; die "$ctl exited"; }
  start_metrics_server

  say "creating Sandbox $ns/$sandbox ($(realpath --relative-to="$root" "$example"))"
  kc -n "$ns" apply -f "$example" >/dev/null
  say "waiting for the controller to create Pod $ns/$sandbox and the scheduler to bind it"
  wait_until "Pod $ns/$sandbox bound to $node" 60 "$ctl" pod_bound
  say "Pod $ns/$sandbox is bound to $node"

  say "waiting for the Pod to go Running (vk-sandbox claims a VM from sandboxd)"
  if SOFT=1 wait_until "Pod Running" 60 vk-sandbox pod_running; then
    local ip claim
    ip=$(jp -n "$ns" get pod "$sandbox" -o 'jsonpath={.status.podIP}')
    claim=$(jp -n "$ns" get pod "$sandbox" -o 'jsonpath={.metadata.annotations.sandbox\.cocoonstack\.io/claim-id}')
    say "Pod $ns/$sandbox is Running with the VM address $ip (claim ${claim:-?})"
    if SOFT=1 wait_until "Sandbox Ready" 30 "$ctl" sandbox_ready; then
      say "Sandbox $ns/$sandbox is Ready (podIPs $(jp -n "$ns" get sandbox "$sandbox" -o 'jsonpath={.status.podIPs}'))"
    else
      say "Sandbox $ns/$sandbox is not Ready after 30s: $(jp -n "$ns" get sandbox "$sandbox" \
        -o 'jsonpath={.status.conditions[?(@.type=="Ready")].message}')"
    fi
    if [[ -s "$dir/metrics-server.port" ]] && alive metrics-server; then
      say "waiting for kubectl top pod $sandbox (metrics-server scrapes the node's /metrics/resource every 10s)"
      if SOFT=1 wait_until "kubectl top pod" 90 metrics-server top_works; then
        say "kubectl top pod $sandbox: $(kc -n "$ns" top pod "$sandbox" --no-headers 2>/dev/null)"
      else
        say "NOTE: kubectl top pod $sandbox does not answer yet: $(kc -n "$ns" top pod "$sandbox" 2>&1 | tail -n 1)"
      fi
    fi
    say "waiting for the NodeInventory to list the sandbox"
    if SOFT=1 wait_until "NodeInventory $node with the sandbox" 30 vk-sandbox inventory_listed; then
      say "NodeInventory $node: $(jp get nodeinventories.sandbox.cocoonstack.io "$node" \
        -o 'jsonpath={range .entries[*]}{.name} {.phase} {.id}{"; "}{end}pools: {range .pools[*]}{.template} warm {.warm}/{.target}{" "}{end}')"
    fi
  else
    local phase reason
    phase=$(jp -n "$ns" get pod "$sandbox" -o 'jsonpath={.status.phase}')
    reason=$(jp -n "$ns" get pod "$sandbox" -o 'jsonpath={.status.reason}')
    say "NOTE: the Pod is still ${phase:-without a phase}${reason:+ ($reason)} after 60s;"
    say "NOTE: see $dir/vk-sandbox.log and kubectl -n $ns describe pod $sandbox."
  fi
  $upstream && warm_pool_tour
  summary
}

# metrics-server (built from its Go module by e2e/metrics-server.sh, cached)
# as the plane's metrics API, scraping the demo's node as it scrapes any
# kubelet: its own ServiceAccount, the APIService v1beta1.metrics.k8s.io
# through an ExternalName Service naming localhost. Registered only once it
# serves: an aggregated API that does not answer stalls namespace deletion.
start_metrics_server() {
  local bin status=0
  bin=$("$here/metrics-server.sh" build) || status=$?
  if (( status == 3 )); then
    say "NOTE: no kubectl top in this demo: $bin"
    return 0
  elif (( status != 0 )); then
    die "e2e/metrics-server.sh build failed"
  fi
  kc -n kube-system create serviceaccount "$metrics_sa" --dry-run=client -o yaml | kc apply -f - >/dev/null
  kc create clusterrolebinding "$metrics_sa" --clusterrole=cluster-admin \
    --serviceaccount="kube-system:$metrics_sa" --dry-run=client -o yaml | kc apply -f - >/dev/null
  "$here/cluster.sh" sa-kubeconfig "$dir/metrics-server.kubeconfig" kube-system "$metrics_sa" >/dev/null
  local port
  port=$(free_port 18443)
  echo "$port" >"$dir/metrics-server.port"
  say "starting metrics-server on 127.0.0.1:$port (kubectl top; node $node only)"
  start metrics-server "$bin" --kubeconfig="$dir/metrics-server.kubeconfig" \
    --authentication-kubeconfig="$dir/metrics-server.kubeconfig" \
    --authorization-kubeconfig="$dir/metrics-server.kubeconfig" \
    --cert-dir="$dir/metrics-server-certs" --bind-address=127.0.0.1 --secure-port="$port" \
    --kubelet-insecure-tls --kubelet-preferred-address-types=InternalIP \
    --kubelet-use-node-status-port --kubelet-request-timeout=5s --metric-resolution=10s \
    --node-selector="kubernetes.io/hostname=$node"
  wait_until "metrics-server to serve" 60 metrics-server metrics_server_live
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: $metrics_sa, namespace: kube-system}
spec: {type: ExternalName, externalName: localhost}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: $metrics_api}
spec:
  group: metrics.k8s.io
  version: v1beta1
  service: {namespace: kube-system, name: $metrics_sa, port: $port}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
EOF
}

# The metrics API goes first (a registered API nobody serves stalls
# namespace deletion), then what it was made of.
stop_metrics_api() {
  kc delete apiservice "$metrics_api" --ignore-not-found >/dev/null 2>&1 || true
  kc -n kube-system delete service "$metrics_sa" --ignore-not-found >/dev/null 2>&1 || true
  kc delete clusterrolebinding "$metrics_sa" --ignore-not-found >/dev/null 2>&1 || true
  kc -n kube-system delete serviceaccount "$metrics_sa" --ignore-not-found >/dev/null 2>&1 || true
}

# The warm pool and a claim (upstream agent-sandbox's extensions).
warm_pool_tour() {
  say "applying manifests/examples/sandboxtemplate.yaml and sandboxwarmpool.yaml (a pool of $(grep -E '^  replicas:' "$examples/sandboxwarmpool.yaml" | awk '{print $2}'))"
  kc -n "$ns" apply -f "$examples/sandboxtemplate.yaml" -f "$examples/sandboxwarmpool.yaml" >/dev/null
  if ! SOFT=1 wait_until "the warm pool's Pods Running" 120 vk-sandbox pool_running; then
    say "NOTE: the warm pool's Pods are not all Running after 120s: kubectl -n $ns get sandboxes,pods -o wide"
    return 0
  fi
  say "warm pool $pool_name: $(jp -n "$ns" get pods -l agents.x-k8s.io/warm-pool-sandbox \
    -o 'jsonpath={range .items[*]}{.metadata.name} on {.metadata.annotations.sandbox\.cocoonstack\.io/claim-id}; {end}')"
  local before
  before=$(claims_made)
  say "applying manifests/examples/sandboxclaim.yaml (claim $claim_name from pool $pool_name)"
  kc -n "$ns" apply -f "$examples/sandboxclaim.yaml" >/dev/null
  if SOFT=1 wait_until "SandboxClaim $claim_name Ready" 60 vk-sandbox claim_ready; then
    local sb vm
    sb=$(jp -n "$ns" get sandboxclaim "$claim_name" -o 'jsonpath={.status.sandbox.name}')
    vm=$(jp -n "$ns" get pod "$sb" -o 'jsonpath={.metadata.annotations.sandbox\.cocoonstack\.io/claim-id}')
    say "claim $claim_name adopted the warm Sandbox $sb: its Pod keeps running on $vm (now owned by the claim: $(jp -n "$ns" get sandbox "$sb" -o 'jsonpath={.metadata.ownerReferences[0].kind}'))"
    SOFT=1 wait_until "the pool to refill" 60 vk-sandbox pool_running || true
    say "sandboxd claims made: $before before the claim, $(claims_made) now (the adoption made none; the pool's replacement one)"
  else
    say "NOTE: SandboxClaim $claim_name is not Ready after 60s: kubectl -n $ns describe sandboxclaim $claim_name"
  fi
}

summary() {
  local sim_url
  sim_url=$(cat "$dir/sandboxd.url" 2>/dev/null || echo http://127.0.0.1:7777)
  cat <<EOF

The demo is running. Its kubeconfig: $dir/kubeconfig (the admin's, namespace $ns)
(vk-sandbox itself runs as the ServiceAccount of manifests/rbac.yaml: $dir/vk-sandbox.kubeconfig)
Logs and PIDs: $dir/{vk-sandbox,agent-sandbox-controller,sandboxd-sim,metrics-server}.{log,pid}

In your shell (in this checkout: the tour uses manifests/examples/):
  export KUBECONFIG=$dir/kubeconfig
  alias kubectl=$(k8s_bin)/kubectl
  alias sandboxd-sim=$bindir/sandboxd-sim; export SANDBOXD_SIM_URL=$sim_url

Then try (the README's "Quick tour"):
  kubectl get node $node -o wide; kubectl get sandboxes,pods -o wide
  # Into the VM: a command (its exit code is kubectl's), a shell under a terminal
  kubectl exec $sandbox -- sh -c 'uname -a; exit 3'; echo "exit code \$?"
  kubectl exec -it $sandbox -- sh                      # exit to leave
  # A server started in the sandbox (the guest is this machine's userland, on a
  # loopback of its own), reached through port-forward
  kubectl exec $sandbox -- sh -c 'echo hello from the sandbox >index.html; python3 -m http.server 8080 >http.log 2>&1 &'
  kubectl port-forward pod/$sandbox 18080:8080 & sleep 1; curl -s localhost:18080; kill %1
  kubectl top pod $sandbox                             # the VM's memory, through metrics-server
  # Suspend: the Pod goes, the VM is hibernated (its processes stopped, memory kept);
  # resume: a new Pod adopts the same VM, the server still running
  kubectl patch sandbox $sandbox --type merge -p '{"spec":{"operatingMode":"Suspended"}}'
  kubectl wait --for=delete pod/$sandbox; kubectl get sandbox $sandbox      # Ready False: SandboxSuspended
  sandboxd-sim ctl claims | jq -c '.[] | {id, claim_ref, hibernated}'; ps -o pid,stat,args -C python3   # stopped: T
  kubectl patch sandbox $sandbox --type merge -p '{"spec":{"operatingMode":"Running"}}'
  kubectl wait --for=create pod/$sandbox; kubectl wait --for=condition=Ready pod/$sandbox
  kubectl port-forward pod/$sandbox 18080:8080 & sleep 1; curl -s localhost:18080; kill %1
  # Delete the Pod: the controller re-creates it and vk-sandbox adopts the same
  # VM (same claim-id, no new claim); delete the Sandbox: its VM is released
  kubectl get pod $sandbox -o jsonpath='{.metadata.annotations.sandbox\.cocoonstack\.io/claim-id}{"\n"}'
  kubectl delete pod $sandbox; kubectl wait --for=create pod/$sandbox
  kubectl get pod $sandbox -o jsonpath='{.metadata.annotations.sandbox\.cocoonstack\.io/claim-id}{"\n"}'
  kubectl delete sandbox $sandbox; sandboxd-sim ctl requests --path /v1/sandboxes/
  # The warm pool and the claim (manifests/examples/sandbox{template,warmpool,claim}.yaml)
  kubectl get sandboxtemplates,sandboxwarmpools,sandboxclaims,sandboxes
  kubectl get sandboxclaim $claim_name -o jsonpath='{.status.sandbox.name}{"\n"}'   # the adopted Sandbox
  kubectl delete sandboxclaim $claim_name; kubectl delete sandboxwarmpool $pool_name   # their VMs released
  # Behind the scenes
  kubectl get nodeinventories.sandbox.cocoonstack.io $node -o yaml   # what sandboxd holds, published every 5s
  sandboxd-sim ctl claims; sandboxd-sim ctl requests --path /v1/   # sandboxd's claims, and the requests it got
  $bindir/vk-sandbox claims list --state-path $dir/vk-state/claims.json
  $bindir/vk-sandbox claims verify --state-path $dir/vk-state/claims.json --sandboxd-url $sim_url --sandboxd-token-file $dir/sandboxd.token

Stop everything: make demo-down
EOF
}

cmd_down() {
  mkdir -p "$dir"
  if cluster_ready && alive vk-sandbox; then
    # While vk-sandbox and the controller still run, so the VMs are
    # released rather than left behind.
    say "deleting the demo's claims, warm pools and Sandboxes in $ns"
    kc -n "$ns" delete sandboxclaims,sandboxwarmpools --all --wait=true --timeout=20s >/dev/null 2>&1 || true
    kc -n "$ns" delete sandboxes --all --wait=true --timeout=20s >/dev/null 2>&1 || true
    SOFT=1 wait_until "the demo's Pods gone" 30 "" no_pods || true
  fi
  cluster_ready && stop_metrics_api
  stop_services
  if [[ "${VK_DEMO_KEEP_CLUSTER:-0}" == 1 ]]; then
    if cluster_ready; then
      # Nothing completes the deletion of Pods left on the stopped node.
      kc -n "$ns" delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
      kc delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
      kc delete node "$node" >/dev/null 2>&1 || true
    fi
    say "left the control plane running (VK_DEMO_KEEP_CLUSTER=1); e2e/cluster.sh down stops it"
  else
    say "stopping the local control plane"
    "$here/cluster.sh" down >/dev/null 2>&1 || true
  fi
  say "down; logs kept in $dir"
}

cmd_status() {
  local svc
  for svc in "${services[@]}"; do
    if alive "$svc"; then echo "$svc: running (pid $(pid_of "$svc"), log $dir/$svc.log)"
    else echo "$svc: stopped"; fi
  done
  "$here/cluster.sh" status
}

phase=${1:-}
case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
