#!/usr/bin/env bash
# `make demo` / `make demo-down`: a Sandbox, a warm pool and a claim going
# Running on a vk-sandbox node, everything on this machine.
#
#   e2e/demo.sh up       build what is missing, start the local control plane,
#                        the sandboxd simulator, the upstream agent-sandbox
#                        controller (e2e/agent-sandbox.sh; the stand-in only
#                        where its source is absent) and vk-sandbox, then
#                        apply manifests/examples/: the Sandbox to Running /
#                        Ready, the SandboxTemplate + SandboxWarmPool to warm
#                        Pods, the SandboxClaim adopting one of them
#   e2e/demo.sh down     stop everything `up` started, then the control plane
#   e2e/demo.sh status   what runs, and where its logs are
#
# Binaries are debug builds (target/debug: shared with `make test`, so usually
# already built); VK_DEMO_PROFILE=release builds and uses release ones;
# VK_DEMO_NO_BUILD=1 uses the binaries already there.
# Everything the demo writes (PIDs, logs, tokens, kubeconfigs, state) is in
# .cache/demo/ (VK_DEMO_DIR). VK_DEMO_KEEP_CLUSTER=1 makes `down` leave the
# control plane running.
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
# is the upstream one (agent-sandbox-controller) or, without its source,
# the stand-in (sandbox-controller).
services=(sandboxd-sim agent-sandbox-controller sandbox-controller vk-sandbox)

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

  # The Sandbox controller: upstream agent-sandbox, built with Go (cached).
  local which_status=0 controller
  say "building (or reusing) the upstream agent-sandbox controller (e2e/agent-sandbox.sh)"
  controller=$("$here/agent-sandbox.sh" which) || which_status=$?
  case $which_status in
    0) upstream=true ;;
    3) upstream=false; say "NOTE: $controller" ;;
    *) die "cannot build the upstream agent-sandbox controller (e2e/agent-sandbox.sh which)" ;;
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

The demo is running. Admin kubeconfig: $(admin_kubeconfig)
(vk-sandbox itself runs as the ServiceAccount of manifests/rbac.yaml: $dir/vk-sandbox.kubeconfig)
Logs and PIDs: $dir/{vk-sandbox,agent-sandbox-controller,sandboxd-sim}.{log,pid}

In your shell:
  export KUBECONFIG=$(admin_kubeconfig)
  alias kubectl=$(k8s_bin)/kubectl
  alias sandboxd-sim=$bindir/sandboxd-sim; export SANDBOXD_SIM_URL=$sim_url

Then try:
  kubectl get node $node -o wide
  kubectl get nodeinventories.sandbox.cocoonstack.io $node -o yaml   # what sandboxd holds, published every 5s
  kubectl -n $ns get sandboxes,pods -o wide
  # delete the Pod: the controller re-creates it, vk-sandbox adopts the same claim (no new VM)
  kubectl -n $ns delete pod $sandbox; kubectl -n $ns get pod $sandbox -w
  kubectl -n $ns get pod $sandbox -o jsonpath='{.metadata.annotations.sandbox\.cocoonstack\.io/claim-id}{"\n"}'
  sandboxd-sim ctl claims                      # live claims (one, whatever you delete)
  sandboxd-sim ctl requests --path /v1/        # claim / release requests sandboxd received
  # vk-sandbox's claims state (snapshot + journal), read-only; and against sandboxd's listing
  $bindir/vk-sandbox claims list --state-path $dir/vk-state/claims.json
  $bindir/vk-sandbox claims verify --state-path $dir/vk-state/claims.json --sandboxd-url $sim_url --sandboxd-token-file $dir/sandboxd.token
  # delete the Sandbox: the Pod is garbage-collected and vk-sandbox releases the VM
  kubectl -n $ns delete sandbox $sandbox; kubectl -n $ns get pods -w
  sandboxd-sim ctl requests --path /v1/sandboxes/
  # again: kubectl -n $ns apply -f manifests/examples/sandbox.yaml
  # the warm pool and the claim (manifests/examples/sandbox{template,warmpool,claim}.yaml)
  kubectl -n $ns get sandboxtemplates,sandboxwarmpools,sandboxclaims,sandboxes
  kubectl -n $ns get sandboxclaim $claim_name -o jsonpath='{.status.sandbox.name}{"\n"}'   # the adopted Sandbox
  # delete the claim: its Sandbox goes and vk-sandbox releases exactly that VM
  kubectl -n $ns delete sandboxclaim $claim_name; sandboxd-sim ctl requests --path /v1/sandboxes/
  # scale the pool (down releases VMs, up claims new ones), or delete it
  kubectl -n $ns patch sandboxwarmpool $pool_name --type merge -p '{"spec":{"replicas":3}}'
  kubectl -n $ns delete sandboxwarmpool $pool_name

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
